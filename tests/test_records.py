"""The records that cross the layers: each a dataclass whose file form reads back to itself, reads what older
versions wrote, and has one line of text."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from dart_core.acceptance import SamplingConfig
from dart_core.budget.step_budget import BudgetChoice, CurveFix, StepBudget
from dart_core.machine.hardware import Hardware
from dart_core.machine.records import CostCurve, DraftKernelChoice, DtypeChoice, KernelsInUse, MachineRecord, \
    dtype_spelling
from dart_core.setup.dtype_choice import decide, lossless_choice
from dart_core.trace import RunSettings, StepRecord
from tests.app_fixtures import tiny_engine

CURVE = CostCurve((1, 8, 64), (0.02, 0.03, 0.1), 256, (0.021, 0.029, 0.1))
CHOICE = BudgetChoice(6, 5, 2.4567891, 61.23456789, 12, 40.1, 8, plain_tokens_per_s=50.0, best_drafting=6,
                      overhead_s=0.0043219, tokens_by_budget=[1.0, 1.23456, 2.0], nodes_by_budget=[0.0, 1.0, 2.5])


def through_json(record):
    """to_dict, written and read as a file is, then from_dict."""
    return type(record).from_dict(json.loads(json.dumps(record.to_dict())))


def test_a_step_budget_reads_back_what_it_wrote():
    fix = CurveFix(0.39, "scaled", CURVE)
    budget = StepBudget(6, True, CHOICE.recorded(), fix, lookup=5)
    assert through_json(budget) == budget and list(budget.to_dict()) == ["nodes", "auto", "choice", "curve", "lookup"]
    assert StepBudget(4).to_dict() == {"nodes": 4, "auto": False}                        # a fixed budget, as ever
    # the choice is recorded with its estimates rounded as the file keeps them, so a replay reads what a run saw
    assert CHOICE.recorded().expected_tokens == 2.4568 and CHOICE.recorded().tokens_by_budget == [1.0, 1.235, 2.0]
    assert through_json(CHOICE.recorded()) == CHOICE.recorded()
    # with the curve the choice weighed (the machine's as the run measured it), rounded as the file keeps it too
    weighed = replace(CHOICE, curve=CostCurve((1, 4, 8, 64), (0.0181234567, 0.025, 0.03, 0.1), 256))
    assert weighed.recorded().curve.seconds[0] == 0.018123 and through_json(weighed.recorded()) == weighed.recorded()


def test_a_step_budget_of_the_first_automatic_budgets_still_reads():
    # what the first automatic budget wrote: no branch length, no plain rate, no per-budget estimates
    old = {"nodes": 8, "auto": True, "choice": {"budget": 8, "expected_tokens": 2.1, "expected_tokens_per_s": 30.5,
                                                  "steps_seen": 4, "start_tokens_per_s": 28.0, "start": 8}}
    budget = StepBudget.from_dict(old)
    assert budget.choice.lookup_tokens is None and budget.choice.tokens_by_budget == [] and budget.lookup is None
    assert budget.curve is None and budget.choice.plain_tokens_per_s == 0.0
    assert budget.text() == "node budget 8 (automatic: 2.10 tokens per step expected, 30.5 tok/s, from 4 steps)"


@pytest.mark.parametrize("budget, text", [
    (StepBudget(4), "node budget 4 (fixed)"),
    (StepBudget(4, True), "node budget 4 (automatic, still measuring)"),
    (StepBudget(0, True, CHOICE), "plain decoding: no tree pays on this machine (automatic budget)"),
    (StepBudget(6, True, CHOICE, lookup=5), "node budget 6, lookup branch 5 (automatic: 2.46 tokens per step "
                                            "expected, 61.2 tok/s, from 12 steps)"),
    (StepBudget(6, True, BudgetChoice(0, None, 1.0, 50.0, 12, 40.0, 8)),
     "node budget 6 (automatic: 1.00 tokens per step expected, 50.0 tok/s, from 12 steps · a probe step)"),
    (StepBudget(4, True, None, CurveFix(2.5, "re-measured", CURVE)),
     "node budget 4 (automatic, still measuring) · the cost curve was re-measured: verifies took 2.50× what it said"),
])
def test_a_step_budget_says_how_it_was_set_in_one_line(budget, text):
    assert budget.text() == text


def test_a_step_record_keeps_its_budget_through_the_file():
    step = StepRecord(3, "verify", 10, [5, 6], accepted=1, budget=StepBudget(6, True, CHOICE.recorded(), lookup=2))
    d = json.loads(json.dumps(step.to_dict()))
    assert d["budget"]["lookup"] == 2 and StepRecord.from_dict(d).budget == step.budget
    assert StepRecord.from_dict({**d, "budget": None}).budget is None


OLD_MACHINE = {   # a trace's machine record before it was a dataclass: torch's dtype names, an older Hardware
    "hardware": {"device": "cpu", "name": "Some CPU", "capability": "AVX2", "threads": 2, "onednn": True,
                 "onednn_bf16": False, "onednn_fp16": False, "mkl": True, "stand_ins": []},
    "summary": "Some CPU · AVX2 · 2 threads · bf16 kernels: no", "kernels": None, "dtype": "float32",
    "dtype_choice": {"dtype": "fp32", "reason": "fp32: bf16 is not faster here (decoder linears, ...)",
                     "seconds": {"float32": [0.0273, 0.0341], "bfloat16": [0.0196, 0.1249]}},
    "cost_curve": {"rows": [1, 64], "seconds": [0.01, 0.05], "context": 256},
    "draft_kernels": {"int8": True, "reason": "int8: faster here, a drafting step 5.8 ms in int8, 9.5 ms in fp32",
                      "seconds": {"fp32": 0.0095, "int8": 0.0058}}}


def test_an_old_machine_record_reads_with_one_spelling_of_the_dtype():
    m = MachineRecord.from_dict(OLD_MACHINE)
    assert m.dtype == "fp32" and set(m.dtype_choice.seconds) == {"fp32", "bf16"}
    assert m.hardware == Hardware("cpu", "Some CPU", "AVX2", 2, True, False, False, True)   # kind, limits: defaults
    assert m.cost_curve == CostCurve((1, 64), (0.01, 0.05)) and m.draft_kernels.int8 and m.draft_kernels.seconds
    assert m.dtype_choice.why == "bf16 is not faster here (decoder linears, ...)"   # no gist: the reason stands in
    assert m.text() == "Some CPU · AVX2 · 2 threads · bf16 kernels: no · fp32 · drafting in int8"
    again = through_json(m)
    assert again == m and again.to_dict()["dtype"] == "fp32"
    assert MachineRecord.from_dict({"summary": "a CPU"}) == MachineRecord(summary="a CPU")   # the oldest: parts only


def test_the_kernels_in_use_keep_their_file_form():
    written = {"buckets": [1, 2, 4], "choices": {"576x576:float32": ["default", "onednn", "onednn"],
                                                  "576x49152:float32": ["default", "default", "onednn"]},
               "extra_mb": 62.3}   # what FastLinears.summary() wrote as a plain dict, in traces and --json
    kernels = KernelsInUse.from_dict(written)
    assert kernels.to_dict() == written and through_json(kernels) == kernels
    machine = MachineRecord(summary="a CPU", kernels=kernels)
    assert through_json(machine).kernels == kernels and machine.to_dict()["kernels"] == written


def test_one_size_of_the_cost_curve_is_what_its_array_form_gives():
    """CostCurve.time (plain Python, asked after every verify) and CostCurve.times (numpy, for many sizes at once)."""
    curve = CostCurve((1, 2, 3, 4, 6, 8, 12, 16), (0.016, 0.0161, 0.0165, 0.0167, 0.0183, 0.0193, 0.0223, 0.026))
    sizes = [0, 0.5, 1, 1.5, 2, 5, 7.3, 8, 15.9, 16, 16.1, 40]
    assert [curve.time(k) for k in sizes] == [float(t) for t in curve.times(sizes)]


def test_the_output_copys_rows_keep_their_file_form_and_their_words():
    machine = MachineRecord(summary="a CPU", forward="lean-native", greedy_copy_rows=16)
    assert through_json(machine) == machine and machine.to_dict()["greedy_copy_rows"] == 16
    assert machine.text() == "a CPU · fp32 · lean-native forward · output copy up to 16 rows"
    assert "greedy_copy_rows" not in MachineRecord(summary="a CPU").to_dict()   # none measured: nothing written
    tiles = MachineRecord(summary="a CPU", greedy_copy_rows=64, greedy_copy_tile_rows=4)
    assert through_json(tiles) == tiles and tiles.text() == "a CPU · fp32 · output copy up to 64 rows, on AMX tiles from 4"
    assert "greedy_copy_tile_rows" not in machine.to_dict()
    assert MachineRecord.from_dict(machine.to_dict()).greedy_copy_tile_rows is None
    vnni = MachineRecord(summary="a CPU", greedy_copy_rows=64, greedy_copy_tile_rows=8, greedy_copy_tiles="vnni")
    assert through_json(vnni) == vnni and vnni.text() == "a CPU · fp32 · output copy up to 64 rows, by VNNI from 8"
    older = tiles.to_dict()
    del older["greedy_copy_tiles"]   # written before VNNI: the tiles were AMX's
    assert MachineRecord.from_dict(older).text() == tiles.text()


def test_a_bf16_models_tiles_keep_their_file_form_and_their_words():
    tiles = MachineRecord(summary="a CPU", dtype="bf16", forward="lean-native", bf16_tiles="amx")
    assert through_json(tiles) == tiles
    assert tiles.text() == "a CPU · bf16 · lean-native forward · bf16 products on AMX tiles"
    dots = MachineRecord(summary="a CPU", dtype="bf16", forward="lean-native", bf16_tiles="avx512-bf16")
    assert through_json(dots) == dots
    assert dots.text() == "a CPU · bf16 · lean-native forward · bf16 products by AVX512-BF16"
    assert "bf16_tiles" not in MachineRecord(summary="a CPU").to_dict()   # records without them read as before
    older = tiles.to_dict() | {"bf16_tiles": True}                         # as records before the ways wrote AMX
    assert MachineRecord.from_dict(older) == tiles


def test_the_measured_reading_of_the_weights_keeps_its_file_form_and_its_words():
    ahead = MachineRecord(summary="a CPU", forward="lean-native", prefetch_from=8, stream_rows=2)
    assert through_json(ahead) == ahead
    assert ahead.text() == "a CPU · fp32 · lean-native forward · prefetching from 8 rows · one stream up to 2 rows"
    always = MachineRecord(summary="a CPU", forward="lean-native", prefetch_from=1)   # as before the measurement
    assert through_json(always) == always and always.text() == "a CPU · fp32 · lean-native forward"
    one = MachineRecord(summary="a CPU", forward="lean-native", prefetch_from=8, stream_rows=1)
    assert one.text().endswith("prefetching from 8 rows · one stream up to 1 row")
    assert "prefetch_from" not in MachineRecord(summary="a CPU").to_dict()


def test_where_prompts_were_prefilled_keeps_its_file_form_and_its_words():
    every = MachineRecord(summary="a CPU", forward="lean-native", prefill="any length")
    assert through_json(every) == every
    assert every.text() == "a CPU · fp32 · lean-native forward · prompts of any length in the C layer"
    some = MachineRecord(summary="a CPU", forward="lean-native", prefill="up to 128 tokens")
    assert through_json(some) == some and some.text().endswith("· prompts of up to 128 tokens in the C layer")
    assert "prefill" not in MachineRecord(summary="a CPU").to_dict()   # none (or older records): as before


def test_the_q4_1_blocks_rows_keep_their_file_form_and_their_words():
    blocks = MachineRecord(summary="a CPU", forward="lean-native", q4_1_rows=8)
    assert through_json(blocks) == blocks and blocks.to_dict()["q4_1_rows"] == 8
    assert blocks.text() == "a CPU · fp32 · lean-native forward · Q4_1 blocks up to 8 rows"
    assert "q4_1_rows" not in MachineRecord(summary="a CPU").to_dict()   # none (or older records): as before
    assert MachineRecord.from_dict({"summary": "an old record"}).q4_1_rows == 0


def test_the_weights_pages_keep_their_file_form_and_their_words():
    huge = MachineRecord(summary="a CPU", forward="lean-native", huge_pages=True)
    assert through_json(huge) == huge and huge.to_dict()["huge_pages"] is True
    assert huge.text() == "a CPU · fp32 · lean-native forward · weights on huge pages"
    small = MachineRecord(summary="a CPU", forward="lean-native", huge_pages=False)
    assert through_json(small) == small and small.text() == "a CPU · fp32 · lean-native forward"
    assert "huge_pages" not in MachineRecord(summary="a CPU").to_dict()   # no C layer: nothing written
    assert MachineRecord.from_dict({"summary": "an old record"}).huge_pages is None


def test_run_settings_say_how_the_run_was_made_in_one_line():
    assert SamplingConfig().text() == "greedy"
    assert SamplingConfig(0.7, 0.9, 50, 3).text() == "temperature 0.7, top-p 0.9, top-k 50, seed 3"
    settings = RunSettings(model="default", dtype="bf16", sampling=SamplingConfig(0.7, 0.9, 50, 3),
                           machine=MachineRecord(summary="Some CPU · AVX2 · 2 threads"))
    assert settings.text() == "model default (bf16) · temperature 0.7, top-p 0.9, top-k 50, seed 3 · " \
                              "Some CPU · AVX2 · 2 threads"
    assert RunSettings().text() == "model ? (fp32) · greedy"


def test_the_benchs_draft_kernels_read_in_either_form():
    # bench reports before the record wrote the kernels alone; traces wrote the whole choice, as both do now; records
    # from before the C layer drafted said int8 or not
    assert DraftKernelChoice.from_dict("int8").int8 and not DraftKernelChoice.from_dict("fp32").int8
    choice = DraftKernelChoice.from_dict(OLD_MACHINE["draft_kernels"])
    assert choice.kernels == "int8" and choice.seconds == OLD_MACHINE["draft_kernels"]["seconds"]
    assert through_json(choice) == choice and choice.to_dict() == {
        "kernels": "int8", **{k: v for k, v in OLD_MACHINE["draft_kernels"].items() if k != "int8"}}
    assert DraftKernelChoice.from_dict({"int8": False, "reason": "off"}).kernels == "fp32"
    native = DraftKernelChoice("native", "native (--draft-kernels native)")
    assert native.to_dict() == {"kernels": "native", "reason": "native (--draft-kernels native)"}
    assert through_json(native) == native and not native.int8


def test_a_dtype_choice_carries_its_gist_for_the_header():
    lossless = lossless_choice()
    assert lossless.reason.startswith("fp32: the dtype in which DART's greedy output is token-identical to plain "
                                      "decoding (in bf16")
    assert lossless.text() == "fp32 (the dtype in which DART's greedy output is token-identical to plain decoding)"
    measured = decide({"float32": [0.0273, 0.0341], "bfloat16": [0.0196, 0.1249]})
    assert measured.text() == "fp32 (bf16 is not faster here)" and set(measured.seconds) == {"fp32", "bf16"}
    assert through_json(measured) == measured and through_json(lossless) == lossless
    assert DtypeChoice.because("bf16", "native on X").reason == "bf16: native on X"


def test_a_dtype_has_one_spelling():
    assert [dtype_spelling(d) for d in (torch.float32, torch.bfloat16, torch.float16)] == ["fp32", "bf16", "fp16"]
    assert [dtype_spelling(d) for d in ("float32", "fp32", "torch.bfloat16")] == ["fp32", "fp32", "bf16"]


def test_run_settings_keep_their_machine_record():
    settings = RunSettings(model="tiny", machine=MachineRecord.from_dict(OLD_MACHINE))
    back = RunSettings.from_dict(json.loads(json.dumps(settings.to_dict())))
    assert back == settings and back.machine.cost_curve.time(64) == pytest.approx(0.05)
    assert RunSettings.from_dict({"machine": None}).machine is None


def test_the_apps_header_reads_the_choices_gist():
    engine = tiny_engine(ngram=False)
    engine.target.dtype_choice = lossless_choice()
    engine.loaded.__dict__["draft_choice"] = DraftKernelChoice("int8", "int8 (--draft-kernels int8)")   # not measured
    header = engine.describe()
    assert "draft head: random, drafting in int8 · n-gram: none · fp32 (the dtype in which DART's greedy output " \
           "is token-identical to plain decoding) · " in header
    engine.loaded.__dict__["draft_choice"] = DraftKernelChoice("native", "native: the fastest here")
    assert "draft head: random, drafting in bf16 through our C layer · " in engine.describe()
    engine.target.dtype_choice = None
    engine.loaded.__dict__["draft_choice"] = DraftKernelChoice("fp32", "fp32 (--draft-kernels fp32)")
    assert "draft head: random · n-gram: none · fp32 · " in engine.describe()
