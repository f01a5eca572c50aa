"""Capabilities and kernels: each kernel path only where the machine has it, every fallback lossless, the swap
confined to our own forwards, and the measurements cached per machine. Every path gated on a capability runs here on
any machine: through the `capable` fixture (tests/conftest.py), on the real kernel where this CPU has it and on a
stand-in with its interface where it does not (the run's header and summary say which)."""

from __future__ import annotations

import pytest
import torch

from dart_core.decoding import GenerationConfig, run
from dart_core.machine.hardware import Hardware, detect
from dart_core.machine import few_rows
from dart_core.machine.kernels import DEFAULT, FEW_ROWS, FEW_ROWS_STAND_IN, ONEDNN, ONEDNN_OPS, ROW_BUCKETS, \
    STAND_IN_OPS, KernelPlan, PackedLinear, available_kernels, decoder_linears, measure_plan, pack_ops, shape_key
from dart_core.proposers import DartProposer, HeadDrafter
from dart_core.setup import calibration
from dart_core.machine.records import CostCurve
from dart_core.setup.calibration import measure_cost_curve
from dart_core.machine.kernels import onednn_applies
from dart_core.target import TargetModel
from dart_core.tree_search import SearchConfig
from dart_core.setup.tiny_models import OracleDrafter, plain_greedy_reference, random_head, tiny_target

PROMPTS = [[1, 5, 9, 13, 17], [1, 40, 41, 42, 40, 41, 42, 40], [1, 3]]


def all_on(target: TargetModel, kernel: str = ONEDNN) -> KernelPlan:
    keys = {shape_key(m) for m in decoder_linears(target.model)}
    return KernelPlan({k: [kernel] * len(ROW_BUCKETS) for k in keys})


def greedy_outputs(target: TargetModel, proposer, n: int = 20) -> list[list[int]]:
    return [run(target, proposer, p, GenerationConfig(max_new_tokens=n)).output_ids for p in PROMPTS]


def test_detect_reads_torchs_own_queries():
    hw = detect()
    assert hw.is_cpu and hw.capability == torch.backends.cpu.get_cpu_capability()
    assert hw.threads == torch.get_num_threads() and hw.onednn == torch.backends.mkldnn.is_available()
    assert hw.onednn_bf16 == (hw.onednn and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
    assert hw.few_rows == (few_rows.kernel(hw.kind) is not None)
    off = hw.without("onednn", "onednn_bf16")
    assert not off.onednn and not off.onednn_bf16 and off.name == hw.name
    assert hw.capability in hw.describe() and "threads" in hw.describe()


def test_bf16_kernels_only_where_the_cpu_has_them():
    linear = torch.nn.Linear(8, 4).to(torch.bfloat16)
    with_bf16 = Hardware(onednn=True, onednn_bf16=True)
    without = Hardware(onednn=True, onednn_bf16=False)   # an AVX2-only CPU: oneDNN's bf16 path would raise
    assert onednn_applies(linear, with_bf16) and not onednn_applies(linear, without)
    assert available_kernels(without, torch.bfloat16) == [DEFAULT]
    assert available_kernels(without, torch.float32) == [DEFAULT, ONEDNN]
    assert available_kernels(Hardware(), torch.float32) == [DEFAULT]


def test_every_capability_off_decodes_losslessly_in_fp32_and_runs_in_bf16():
    for dtype in (torch.float32, torch.bfloat16):
        base = tiny_target("llama", seed=3, dtype=dtype)
        target = TargetModel(base.model, hardware=detect().without("onednn", "onednn_bf16", "mkl",
                                                                                        "few_rows"))
        assert not target.own_output_layer                      # without a packed kernel: the model's own forward
        target.use_kernels(measure_plan(target.planned_linears(), target.hardware))
        assert target.fast_linears.plan.choices == {}           # nothing but the default kernel to choose from
        dart = DartProposer(HeadDrafter(random_head(target, n_mask=3, seed=1), target), SearchConfig(node_budget=8))
        outs = greedy_outputs(target, dart)
        if dtype == torch.float32:
            assert outs == [plain_greedy_reference(target, p, 20) for p in PROMPTS]
        else:
            assert all(len(o) == 20 for o in outs)


def test_stand_ins_turn_capabilities_on_where_the_machine_lacks_them():
    bare = Hardware(onednn=True, onednn_bf16=False)            # an AVX2-only CPU
    on = bare.with_stand_ins("onednn", "onednn_bf16")
    assert on.onednn_bf16 and on.stand_ins == ("onednn_bf16",)  # oneDNN itself is real here, its bf16 path is not
    assert pack_ops(on, torch.bfloat16) is STAND_IN_OPS and pack_ops(on, torch.float32) is ONEDNN_OPS
    assert available_kernels(on, torch.bfloat16) == [DEFAULT, ONEDNN]
    assert "bf16 kernels: stand-in" in Hardware(name="x").with_stand_ins("onednn_bf16").describe()
    full = Hardware(onednn=True, onednn_bf16=True).with_stand_ins("onednn", "onednn_bf16")
    assert full.stand_ins == () and pack_ops(full, torch.bfloat16) is ONEDNN_OPS   # real wherever it exists
    off = on.without("onednn_bf16")
    assert not off.onednn_bf16 and off.stand_ins == ()
    assert pack_ops(Hardware().with_stand_ins("onednn"), torch.float32) is STAND_IN_OPS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linears_follow_their_weights_and_pack_inference_tensors(dtype, capable):
    ops_here = {STAND_IN_OPS, pack_ops(capable, dtype)}            # the stand-in, and the real kernel if it runs here
    if dtype == torch.float32:
        ops_here |= {FEW_ROWS_STAND_IN, pack_ops(capable, dtype, FEW_ROWS)}
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 2e-2}
    x = torch.randn(3, 16).to(dtype)
    for ops in ops_here:
        with torch.inference_mode():           # a weight made in inference mode has no version counter
            made_inside = torch.nn.Linear(16, 8).to(dtype)
            packed = PackedLinear(made_inside, ops)
            assert torch.allclose(packed(x).float(), made_inside(x).float(), **tol)
        linear = torch.nn.Linear(16, 8).to(dtype)
        packed = PackedLinear(linear, ops)
        assert packed(x.unsqueeze(0)).shape == (1, 3, 8)
        with torch.no_grad():
            linear.weight.mul_(2.0)              # changed in place: packed again
        assert torch.allclose(packed(x).float(), linear(x).float(), **tol)
        linear.weight = torch.nn.Parameter(torch.randn(8, 16).to(dtype))   # replaced: packed again
        assert torch.allclose(packed(x).float(), linear(x).float(), **tol)


@pytest.mark.parametrize("dtype,kernel", [(torch.float32, ONEDNN), (torch.bfloat16, ONEDNN),
                                          (torch.float32, FEW_ROWS)])
def test_packed_kernels_give_the_default_logits_and_stay_lossless(dtype, kernel, capable):
    base = tiny_target("llama", seed=4, dtype=dtype)
    target = TargetModel(base.model, hardware=capable)
    assert target.own_output_layer                   # our forwards apply the output layer, in either dtype
    expected = [plain_greedy_reference(target, p, 24) for p in PROMPTS]
    ids, pos = torch.tensor([1, 7, 9, 11]), torch.arange(4)
    plain, _ = target.forward(ids, pos, target.new_cache())
    target.use_kernels(all_on(target, kernel))
    assert target.fast_linears.extra_bytes == sum(m.weight.numel() * m.weight.element_size()
                                                  for m in decoder_linears(target.model))
    fast, _ = target.forward(ids, pos, target.new_cache())
    tol = 1e-4 if dtype == torch.float32 else 0.1
    assert torch.allclose(plain.float(), fast.float(), atol=tol, rtol=tol)
    dart = DartProposer(OracleDrafter(target, n_rows=3), SearchConfig(node_budget=10))
    outs = greedy_outputs(target, dart, 24)
    if dtype == torch.float32:
        assert outs == expected
    else:   # bf16: a k-token verify rounds differently from one-token forwards, so only the length is certain
        assert all(len(o) == 24 for o in outs)
    # the swap lives only inside our forwards: transformers' own model is untouched
    assert all("forward" not in m.__dict__ for m in decoder_linears(target.model))
    out = target.model.generate(input_ids=torch.tensor([PROMPTS[0]]), max_new_tokens=24, do_sample=False)
    assert out[0, len(PROMPTS[0]):].tolist() == expected[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_measured_plan_only_chooses_kernels_that_agree(dtype, capable):
    target = tiny_target("llama", seed=5, dtype=dtype)
    linears = decoder_linears(target.model)
    plan = measure_plan(linears, capable, rounds=1)
    assert set(plan.choices) == {shape_key(m) for m in linears}
    for key, choice in plan.choices.items():
        kernels = {DEFAULT, ONEDNN} | ({FEW_ROWS} if dtype == torch.float32 else set())
        assert len(choice) == len(ROW_BUCKETS) and set(choice) <= kernels
        timings = plan.timings[key]
        assert set(timings) == kernels
        for i, kernel in enumerate(choice):   # the chosen kernel is the fastest measured
            assert timings[kernel][i] == min(t[i] for t in timings.values())
    assert plan.kernel_for(next(iter(plan.choices)), 500) == DEFAULT    # a prefill: the default GEMM
    assert KernelPlan.from_dict(plan.to_dict()) == plan


def test_cost_curve_interpolates_and_is_cached_per_machine(tmp_path, monkeypatch):
    curve = CostCurve((1, 2, 4), (0.010, 0.012, 0.020))
    assert curve.time(3) == pytest.approx(0.016) and curve.time(8) == pytest.approx(0.036)
    assert curve.relative(4) == pytest.approx(2.0) and curve.time(1) == 0.010
    assert curve.times([0.5, 1, 1.5, 3, 8]) == pytest.approx([0.010, 0.010, 0.011, 0.016, 0.036])   # at once
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path))
    target = tiny_target("llama", seed=6)
    calls = []

    def counting(t):
        calls.append(1)
        return measure_cost_curve(t, rows=(1, 2, 4), context=16, rounds=1)

    monkeypatch.setattr(calibration, "measure_cost_curve", counting)
    first = calibration.cost_curve(target, "tiny")
    assert first.rows == (1, 2, 4) and all(s > 0 for s in first.seconds)
    assert calibration.cost_curve(target, "tiny") == first and len(calls) == 1       # read back, not measured
    calibration.cost_curve(target, "tiny", recalibrate=True)
    calibration.cost_curve(target, "another model")
    assert len(calls) == 3
    assert len(list((tmp_path / "calibration").glob("cost-*.json"))) == 2


def test_the_output_layer_takes_the_kernel_the_plan_measured_for_its_rows(tmp_path, monkeypatch, capable):
    base = tiny_target("llama", seed=7)
    target = TargetModel(base.model, hardware=capable)
    expected = [plain_greedy_reference(target, p, 24) for p in PROMPTS]
    head_key = shape_key(target.lm_head)
    # the plan: torch's default for 1-2 rows, the packed kernel from 4 (what the AMX Xeon measured)
    target.use_kernels(KernelPlan({head_key: [DEFAULT, DEFAULT] + [ONEDNN] * (len(ROW_BUCKETS) - 2)}))
    assert target.fast_linears.extra_bytes == target.lm_head.weight.numel() * 4   # one packed copy, no second
    packed_calls = []
    packed_call = PackedLinear.__call__

    def spy(self, x):
        if self.linear is target.lm_head:
            packed_calls.append(x.numel() // x.shape[-1])
        return packed_call(self, x)
    monkeypatch.setattr(PackedLinear, "__call__", spy)
    for rows in (1, 2, 4, 8):
        ids, pos = torch.arange(3, 3 + rows), torch.arange(rows)
        logits, _ = target.forward(ids, pos, target.new_cache())
        reference = target.model(input_ids=ids[None]).logits[0]
        assert torch.allclose(logits, reference, atol=1e-4, rtol=1e-4)
    assert packed_calls == [4, 8]
    dart = DartProposer(OracleDrafter(target, n_rows=3), SearchConfig(node_budget=10))
    assert greedy_outputs(target, dart, 24) == expected
    # the set-up measures the output layer with the decoder linears, on this machine
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path))
    plan = calibration.kernel_plan(TargetModel(base.model, hardware=capable))
    assert head_key in plan.choices and set(plan.timings[head_key]) == {DEFAULT, ONEDNN, FEW_ROWS}
    # a target that leaves the output layer to the model measures its own plan: the one above is not read for it
    model_applies_it = TargetModel(base.model, hardware=capable)
    model_applies_it.own_output_layer = False
    assert head_key not in calibration.kernel_plan(model_applies_it).choices
