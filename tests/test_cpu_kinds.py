"""Every CPU kind below this machine's, in one run: the tests whose paths depend on the CPU run again in a child
process held to each older kind by the environment torch's ATen kernels and oneDNN honour (hardware.CPU_KINDS).
On an AMX Xeon that is x86-64, AVX2 (an EPYC Zen 3), AVX-512 with bf16 emulated (a Xeon Cascade Lake) and AVX-512
with native bf16 (an EPYC Zen 4); the main run covers the machine's own kind with the real kernels."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dart_core.machine.hardware import CPU_KINDS, ISA_LIMIT_VARIABLES, cpu_kind, detect, kinds_below

ROOT = Path(__file__).resolve().parent.parent
# the modules whose paths are gated on what the CPU can do: kernel choice and packing, dtype choice, int8 drafting,
# our kernels and the draft head's C layer
CPU_DEPENDENT = ["tests/test_kernels.py", "tests/test_dtype_choice.py", "tests/test_draft_kernels.py",
                 "tests/test_few_rows.py", "tests/test_draft_native.py", "tests/test_greedy_output.py"]
# Their tests, by the kernels they reach. Every kind below this one holds oneDNN down (ONEDNN_MAX_CPU_ISA): the tests
# that reach oneDNN (the capability-gated kernels through `capable`, torch's own bf16 GEMMs, the measurements of
# kernels and dtypes), or read what the CPU can do, run as each kind.
ON_EVERY_KIND = [
    "tests/test_kernels.py::test_detect_reads_torchs_own_queries",
    "tests/test_kernels.py::test_every_capability_off_decodes_losslessly_in_fp32_and_runs_in_bf16",
    "tests/test_kernels.py::test_packed_linears_follow_their_weights_and_pack_inference_tensors",
    "tests/test_kernels.py::test_packed_kernels_give_the_default_logits_and_stay_lossless",
    "tests/test_kernels.py::test_the_measured_plan_only_chooses_kernels_that_agree",
    "tests/test_kernels.py::test_the_output_layer_takes_the_kernel_the_plan_measured_for_its_rows",
    "tests/test_dtype_choice.py::test_the_measurement_times_both_dtypes_without_touching_the_model",
    "tests/test_dtype_choice.py::test_fast_loads_the_measured_dtype_and_auto_the_lossless_one",
    "tests/test_dtype_choice.py::test_fast_and_bf16_load_measure_and_decode_with_the_gated_kernels",
    "tests/test_dtype_choice.py::test_batched_work_measures_at_its_own_rows_and_caches_apart",
    "tests/test_draft_kernels.py::test_greedy_output_does_not_depend_on_the_draft_kernels",
    "tests/test_draft_kernels.py::test_int8_runs_only_where_it_can",
]
# These run models in fp32 and the int8 head and reach no oneDNN primitive (ONEDNN_VERBOSE=1 shows none): ATen's
# kernels (and MKL's fp32 GEMMs and FBGEMM's int8 ones, which no kind limits). Only the kinds that set
# ATEN_CPU_CAPABILITY change their paths; as the others they would repeat this run's paths exactly.
ON_ATEN_KINDS = [
    "tests/test_kernels.py::test_cost_curve_interpolates_and_is_cached_per_machine",
    "tests/test_draft_kernels.py::test_the_int8_copy_drafts_nearly_the_same_rows_and_leaves_the_head_alone",
    "tests/test_draft_kernels.py::test_sampling_with_an_int8_head_matches_the_target_distribution",
    # our few-row kernel is built for the kind's instruction set (AVX2 for avx2, SSE for x86-64: few_rows.MARCH)
    "tests/test_few_rows.py::test_wherever_a_c_compiler_is_found_the_kernels_build",
    "tests/test_few_rows.py::test_it_computes_what_torch_computes_for_any_shape_rows_and_bias",
    "tests/test_few_rows.py::test_a_row_gets_the_same_bits_alone_as_among_others_and_on_any_thread_count",
    "tests/test_few_rows.py::test_bf16_tiles_give_bf16_inputs_product_each_row_alone",
    "tests/test_few_rows.py::test_avx512_bf16_gives_the_bits_of_its_written_out_arithmetic",
    "tests/test_few_rows.py::test_the_kernel_shares_torchs_openmp_runtime",
    "tests/test_few_rows.py::test_bf16_weights_give_the_fp32_product_of_the_widened_weights",
    "tests/test_few_rows.py::test_int8_weights_give_the_product_of_their_scaled_values",
    "tests/test_few_rows.py::test_q4_1_blocks_give_the_bits_of_the_fp32_product",
    "tests/test_few_rows.py::test_weights_that_are_not_q4_1_blocks_are_read_in_fp32",
    "tests/test_few_rows.py::test_the_argmax_picks_what_torchs_max_picks",
    "tests/test_greedy_output.py::test_the_choice_is_the_full_layers_argmax",
    "tests/test_greedy_output.py::test_a_bf16_layer_chooses_as_its_bf16_product_does",
    "tests/test_greedy_output.py::test_nans_and_infinities_choose_as_torch_does",
    "tests/test_greedy_output.py::test_the_bound_holds_for_every_output",
    "tests/test_greedy_output.py::test_the_tiles_hold_the_copy",
    "tests/test_greedy_output.py::test_the_digits_error_is_in_the_bound",
    "tests/test_greedy_output.py::test_amx_tiles_give_their_stand_ins_bits",
    "tests/test_greedy_output.py::test_vnni_gives_the_stand_ins_bits",
    "tests/test_greedy_output.py::test_tiles_are_asked_for_an_int8_copy_only",
    "tests/test_greedy_output.py::test_a_verify_gives_the_choices_its_logits_give",
    "tests/test_greedy_output.py::test_the_copys_rows_are_measured_and_applied",
    "tests/test_draft_native.py::test_its_int8_weights_draft_nearly_the_same_rows",
    "tests/test_draft_native.py::test_its_steps_compute_what_the_head_computes",
    "tests/test_draft_native.py::test_the_searchs_rows_are_torchs_top_k_and_softmax",
    "tests/test_draft_native.py::test_the_cache_grows_and_keeps_what_it_holds",
    "tests/test_draft_native.py::test_greedy_output_with_the_c_layer_is_plain_decodings",
]
# Logic on made-up hardware, timings and command lines: the same on every CPU, run in the main run only.
ON_ANY_CPU = [
    "tests/test_greedy_output.py::test_without_amx_auto_takes_vnni_and_avx512_bf16_where_built_else_the_fmas",
    "tests/test_kernels.py::test_bf16_kernels_only_where_the_cpu_has_them",
    "tests/test_kernels.py::test_stand_ins_turn_capabilities_on_where_the_machine_lacks_them",
    "tests/test_dtype_choice.py::test_bf16_only_where_it_wins_at_every_row_count",
    "tests/test_dtype_choice.py::test_the_choice_is_cached_per_machine",
    "tests/test_dtype_choice.py::test_decoding_takes_bf16_where_the_c_layer_runs_it_and_everything_else_measures",
    "tests/test_dtype_choice.py::test_the_benchs_default_dtypes_add_bf16_only_where_it_is_faster",
    "tests/test_dtype_choice.py::test_train_and_train_data_default_to_the_measured_dtype",
    "tests/test_draft_kernels.py::test_auto_takes_the_fastest_kernels_measured_and_int8_only_by_a_margin",
    "tests/test_draft_kernels.py::test_a_drafting_step_is_timed_after_what_runs_before_it",
    "tests/test_draft_native.py::test_where_it_cannot_run_it_says_why",
    "tests/test_greedy_output.py::test_the_copy_serves_the_rows_where_it_was_never_slower",
    "tests/test_greedy_output.py::test_the_tiles_serve_the_rows_from_which_they_were_never_slower",
    "tests/test_few_rows.py::test_bad_inputs_are_refused_in_one_line",
    "tests/test_few_rows.py::test_a_build_that_cannot_happen_says_why",
    "tests/test_few_rows.py::test_a_fault_in_our_sources_is_told_from_a_missing_toolchain",
]
HERE = detect()
# the kinds below this one that CPUs still ship with; an AVX2 machine runs as the x86-64 baseline
BELOW = [k for k in kinds_below(HERE.kind) if k != "x86-64"] or ["x86-64"]


def as_kind(kind: str) -> dict:
    """This process's environment, held to `kind` (any limit already set is replaced)."""
    env = {k: v for k, v in os.environ.items() if k not in ISA_LIMIT_VARIABLES}
    return {**env, **CPU_KINDS[kind]}


def selected_for(kind: str) -> list[str]:
    """The tests whose paths running as `kind` changes."""
    return ON_EVERY_KIND + (ON_ATEN_KINDS if "ATEN_CPU_CAPABILITY" in CPU_KINDS[kind] else [])


def test_every_test_of_the_cpu_dependent_modules_is_sorted():
    """A test added to those modules runs as the older kinds once it is listed above (or said to be CPU-free)."""
    found = {f"{path}::{node.name}" for path in CPU_DEPENDENT for node in ast.parse((ROOT / path).read_text()).body
             if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    listed = ON_EVERY_KIND + ON_ATEN_KINDS + ON_ANY_CPU
    assert sorted(listed) == sorted(found)            # each exactly once
    assert all(kind in CPU_KINDS for kind in BELOW) and any("ATEN_CPU_CAPABILITY" in CPU_KINDS[k] for k in BELOW)


@pytest.mark.parametrize("kind", BELOW)
def test_the_cpu_dependent_tests_pass_as_an_older_cpu_kind(kind, report):
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selected_for(kind)],
                           cwd=ROOT, env=as_kind(kind), capture_output=True, text=True, timeout=900)
    out = child.stdout + child.stderr
    assert child.returncode == 0, out[-4000:]
    assert f"kind {kind}" in out, out[:2000]           # the child really ran as that kind (its header says so)
    summary = [line for line in out.splitlines() if " passed" in line][-1]
    assert "skipped" not in summary and "deselected" not in summary, summary
    report(f"as {kind}: {summary.strip()}; gated kernels: "
           + next(line for line in out.splitlines() if line.startswith("capability-gated kernels")).split("(")[1]
           .split(")")[0])


def test_the_kinds_are_told_apart_from_torch_and_the_flags(monkeypatch):
    monkeypatch.setattr("dart_core.machine.hardware.cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert cpu_kind("DEFAULT", False) == "x86-64"
    assert cpu_kind("AVX2", False) == "avx2"
    assert cpu_kind("AVX512", False) == "avx2"            # no oneDNN bf16 path: nothing above AVX2 is gated on
    assert cpu_kind("AVX512", True) == "amx"
    for limit, kind in (("AVX512_CORE_BF16", "avx512-bf16"), ("AVX512_CORE_VNNI", "avx512"),
                        ("AVX512_CORE_AMX", "amx"), ("avx512_core_bf16", "avx512-bf16")):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
        assert cpu_kind("AVX512", True) == kind, limit
    monkeypatch.setattr("dart_core.machine.hardware.cpu_flags", lambda: frozenset({"avx512f"}))   # a Cascade Lake
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert cpu_kind("AVX512", True) == "avx512"
    assert kinds_below("avx512-bf16") == ["x86-64", "avx2", "avx512"] and kinds_below("x86-64") == []


def test_a_limited_run_says_so_and_measures_apart(monkeypatch):
    from dart_core.setup.calibration import _file_name
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    limited = detect()
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in limited.limits and "limited by ONEDNN_MAX_CPU_ISA=AVX2" in limited.describe()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    for v in ISA_LIMIT_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    free = detect()
    assert free.limits == ""
    assert _file_name("kernels", limited, []) != _file_name("kernels", free, [])   # no cache shared across kinds


def test_a_measurement_of_our_kernels_is_not_read_once_their_sources_change(monkeypatch):
    from dart_core.machine import few_rows
    from dart_core.machine.hardware import Hardware
    from dart_core.setup.calibration import _file_name
    with_kernels, without = Hardware("cpu", few_rows=True), Hardware("cpu")
    before, before_without = _file_name("cost", with_kernels, []), _file_name("cost", without, [])
    monkeypatch.setattr(few_rows, "sources_digest", lambda: "other sources")
    assert _file_name("cost", with_kernels, []) != before
    assert _file_name("cost", without, []) == before_without    # measured without them: nothing to tell apart
