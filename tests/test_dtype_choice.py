"""The dtype: `--dtype auto` is the lossless fp32; `--dtype fast` takes bf16 only where it measures faster than fp32
at one row and at a verify's rows, the choice cached per machine and reported with its reason; greedy DART stays
token-identical to plain decoding in fp32, and the bench's default list adds bf16 only where it is faster."""

from __future__ import annotations

import pytest
import torch

from dart_core.decoding import GenerationConfig, run
from dart_core.machine import few_rows
from dart_core.machine.hardware import Hardware, detect
from dart_core.machine.kernels import DTYPE_ROWS, decoder_linears, measure_dtypes
from dart_core.proposers import DartProposer, VanillaProposer
from dart_core.setup import dtype_choice
from dart_core.setup.calibration import machine_record
from dart_core.setup.dtype_choice import BF16_MARGIN, choose_cpu_dtype, decide
from dart_core.setup.loading import load_target
from dart_core.setup.models import dtype_name
from dart_core.tools.bench import parse_dtypes
from dart_core.tree_search import SearchConfig
from tests.q4_blocks import as_q4_1_model
from dart_core.setup.tiny_training import word_tokenizer
from dart_core.setup.tiny_models import OracleDrafter, tiny_target


def times(fp32, bf16) -> dict:
    return {"float32": list(fp32), "bfloat16": list(bf16)}


@pytest.mark.parametrize("fp32,bf16,expected", [
    ((27.3, 34.1), (19.6, 124.9), "fp32"),      # the AVX2 EPYC: one row faster in bf16, a verify 3.7x slower
    ((10.0, 20.0), (5.0, 8.0), "bf16"),          # native bf16: faster at both
    ((10.0, 20.0), (5.0, 20.0 * BF16_MARGIN + 0.1), "fp32"),   # not faster enough at a verify's rows
    ((10.0, 20.0), (9.0, 18.0), "bf16"),         # just inside the margin at both
])
def test_bf16_only_where_it_wins_at_every_row_count(fp32, bf16, expected):
    choice = decide(times([t / 1e3 for t in fp32], [t / 1e3 for t in bf16]))
    assert choice.dtype == expected and choice.reason.startswith(expected + ": ")
    assert f"{DTYPE_ROWS[-1]} rows {bf16[-1]:.1f} vs {fp32[-1]:.1f} ms" in choice.reason


def test_the_measurement_times_both_dtypes_without_touching_the_model(capable):
    target = tiny_target("llama")
    linears = decoder_linears(target.model)
    before = [m.weight.clone() for m in linears]
    for hw in (capable, detect().without("onednn", "onednn_bf16")):    # with and without oneDNN's kernels
        seconds = measure_dtypes(linears, hw, rounds=1)
        assert set(seconds) == {"float32", "bfloat16"}
        assert all(len(v) == len(DTYPE_ROWS) and all(t > 0 for t in v) for v in seconds.values())
    assert all(m.weight.dtype == torch.float32 and torch.equal(m.weight, w) for m, w in zip(linears, before))


def test_the_choice_is_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path))
    model, hw = tiny_target("llama").model, detect().without("few_rows")   # the measured path (no C layer)
    calls = []
    monkeypatch.setattr(dtype_choice, "measure_dtypes",
                        lambda linears, hardware, **_: calls.append(1) or times((1.0, 2.0), (0.5, 1.0)))
    assert choose_cpu_dtype(model, hw).dtype == "bf16" and len(calls) == 1
    assert choose_cpu_dtype(model, hw).dtype == "bf16" and len(calls) == 1      # read back
    assert choose_cpu_dtype(model, hw.without("onednn_bf16")).dtype == "bf16" and len(calls) == 1
    assert choose_cpu_dtype(model, hw, recalibrate=True).dtype == "bf16" and len(calls) == 2
    assert len(list((tmp_path / "calibration").glob("dtype-*.json"))) == 1


@pytest.mark.parametrize("measured", ["fp32", "bf16"])
def test_fast_loads_the_measured_dtype_and_auto_the_lossless_one(measured, tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    tiny_target("llama").model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)   # any tokenizer: loading needs one
    fast = times((1.0, 2.0), (0.5, 1.0)) if measured == "bf16" else times((1.0, 2.0), (0.5, 5.0))
    monkeypatch.setattr(dtype_choice, "measure_dtypes", lambda linears, hardware, **_: fast)
    target = load_target(str(folder), "cpu", "fast", hardware=detect().without("few_rows"))
    assert dtype_name(target.dtype) == measured and target.dtype_choice.dtype == measured
    assert all(p.dtype == target.dtype for p in target.model.parameters())
    assert machine_record(target, str(folder)).dtype_choice.reason.startswith(measured)
    prompt = [1, 5, 9, 13, 17, 5, 9]
    assert load_target(str(folder), "cpu", "fp32").dtype_choice is None     # an explicit dtype is not second-guessed
    lossless = load_target(str(folder), "cpu", "auto")                      # whatever was measured: fp32
    assert dtype_name(lossless.dtype) == "fp32" and "token-identical" in lossless.dtype_choice.reason
    plain = run(lossless, VanillaProposer(), prompt, GenerationConfig(max_new_tokens=16)).output_ids
    dart = run(lossless, DartProposer(OracleDrafter(lossless, n_rows=3), SearchConfig(node_budget=6)), prompt,
               GenerationConfig(max_new_tokens=16)).output_ids
    assert dart == plain


@pytest.mark.parametrize("dtype", ["fast", "bf16"])
def test_fast_and_bf16_load_measure_and_decode_with_the_gated_kernels(dtype, capable, tmp_path, monkeypatch,
                                                                      one_thread):
    """`--dtype fast` measured for real (it once crashed on every CPU with a oneDNN bf16 path), and bf16 on the
    kernels measured for it, or on our C layer where it builds: both load and decode."""
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    tiny_target("llama").model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    target = load_target(str(folder), "cpu", dtype, hardware=capable)
    assert target.hardware == capable and dtype_name(target.dtype) in ("fp32", "bf16")
    if dtype == "fast" and target.forward_kind == "lean-native":     # our C layer decodes bf16 weights here
        assert dtype_name(target.dtype) == "bf16" and "C layer" in target.dtype_choice.reason
    elif dtype == "fast":
        assert set(target.dtype_choice.seconds) == {"fp32", "bf16"}   # one spelling
    elif target.forward_kind == "lean-native":   # bf16 weights in our C layer: no kernel plan, no second copy
        assert dtype_name(target.dtype) == "bf16" and target.fast_linears is None
    else:
        assert target.fast_linears is not None and target.fast_linears.plan.timings   # measured in bf16
    prompt = [1, 5, 9, 13, 17, 5, 9]
    out = run(target, DartProposer(OracleDrafter(target, n_rows=3), SearchConfig(node_budget=6)), prompt,
              GenerationConfig(max_new_tokens=12)).output_ids
    assert len(out) == 12


def test_decoding_takes_bf16_where_the_c_layer_runs_it_and_everything_else_measures(tmp_path, monkeypatch):
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path))
    model = tiny_target("llama").model
    with_layer = Hardware("cpu", few_rows=True)          # a CPU where our kernels build
    monkeypatch.setattr(dtype_choice, "measure_dtypes", lambda *a, **k: times((1.0, 2.0), (2.0, 4.0)))  # torch's bf16
    choice = choose_cpu_dtype(model, with_layer)                                                   # slower
    assert choice.dtype == "bf16" and "C layer" in choice.reason and not choice.seconds
    assert choose_cpu_dtype(model, Hardware("cpu").with_stand_ins("few_rows")).dtype == "fp32"   # a stand-in
    assert choose_cpu_dtype(model, Hardware()).dtype == "fp32"                              # no C layer: measured
    from dart_core.machine.kernels import BATCH_ROWS
    assert choose_cpu_dtype(model, with_layer, rows_measured=BATCH_ROWS).dtype == "fp32"    # batched work measures
    assert choose_cpu_dtype(model, with_layer, native=False).dtype == "fp32"   # DART_FORWARD=lean-eager: measured
    blocks = tiny_target("llama")
    as_q4_1_model(blocks)   # fp32 weights that are Q4_1 blocks (the default model's): read as those, fewer bytes
    choice = choose_cpu_dtype(blocks.model, with_layer)
    if few_rows.kernel(with_layer.kind) is not None:
        assert choice.dtype == "fp32" and "Q4_1 blocks" in choice.reason
    else:   # no kernels built here: the blocks are never read
        assert choice.dtype == "bf16"


def test_the_benchs_default_dtypes_add_bf16_only_where_it_is_faster():
    slower, faster = decide(times((1.0, 2.0), (0.5, 5.0))), decide(times((1.0, 2.0), (0.5, 1.0)))
    assert parse_dtypes("auto", lambda: slower) == ["fp32"]
    assert parse_dtypes("auto", lambda: faster) == ["fp32", "bf16"]
    assert parse_dtypes("bf16,fp32", lambda: pytest.fail("an explicit list measures nothing")) == ["bf16", "fp32"]


def test_batched_work_measures_at_its_own_rows_and_caches_apart(tmp_path, monkeypatch, capable):
    """Training and batched generation compare the dtypes at BATCH_ROWS: a CPU without native bf16 can win at one
    row in bf16 (half the bytes) and lose many times over at a training sequence's rows (the AVX2 EPYC: 26 against
    120 anchor tokens/s, docs/training.md)."""
    from dart_core.machine.kernels import BATCH_ROWS
    from dart_core.tools.train import _load
    from dart_core.setup.tiny_training import save_tiny_qwen3

    target = tiny_target("llama")
    seconds = measure_dtypes(decoder_linears(target.model), capable, rounds=1, rows_measured=BATCH_ROWS)
    assert all(len(v) == len(BATCH_ROWS) and all(t > 0 for t in v) for v in seconds.values())

    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    asked = []

    def measured(linears, hardware, rows_measured=DTYPE_ROWS, **_):  # bf16 wins at decoding's rows only
        asked.append(tuple(rows_measured))
        slow = rows_measured == BATCH_ROWS
        return times([1.0] * len(rows_measured), [5.0 if slow else 0.5] * len(rows_measured))

    monkeypatch.setattr(dtype_choice, "measure_dtypes", measured)
    folder = tmp_path / "model"
    save_tiny_qwen3(folder)
    for_training, _ = _load(str(folder), "fast", "cpu")   # what `train` and `train-data` load by default
    assert dtype_name(for_training.dtype) == "fp32" and asked == [BATCH_ROWS]
    assert f"{BATCH_ROWS[-1]} rows" in for_training.dtype_choice.reason
    for_decoding = load_target(str(folder), "cpu", "fast", hardware=detect().without("few_rows"))   # measured
    assert dtype_name(for_decoding.dtype) == "bf16" and asked == [BATCH_ROWS, DTYPE_ROWS]
    _load(str(folder), "fast", "cpu")                      # read back from its own cache file
    assert asked == [BATCH_ROWS, DTYPE_ROWS]
    assert len(list((tmp_path / "cache" / "calibration").glob("dtype-*.json"))) == 2


def test_train_and_train_data_default_to_the_measured_dtype():
    from dart_core.tools.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["train", "--out", "x"]).dtype == "fast"
    assert parser.parse_args(["train-data", "generate", "--out", "x"]).dtype == "fast"
    assert parser.parse_args(["generate", "--prompt", "hi"]).dtype == "auto"   # decoding stays lossless
