"""The int8 draft head: it drafts nearly the rows the fp32 head drafts, the emitted tokens never depend on it (greedy
identical to plain decoding, sampling through the statistical test), it runs only where it can; and `auto` takes the
fastest kernels measured, int8 only by a margin. (The C layer's drafting: tests/test_draft_native.py.)"""

from __future__ import annotations

import pytest
import torch

from dart_core.acceptance import SamplingConfig
from dart_core.decoding import GenerationConfig, run
from dart_core.draft_head import DraftCache
from dart_core.draft_kernels import int8_copy, int8_supported, time_drafting
from dart_core.errors import ConfigError
from dart_core.proposers import DartProposer, HeadDrafter
from dart_core.setup import calibration
from dart_core.machine.records import DraftKernelChoice
from dart_core.setup.calibration import draft_kernel_choice
from dart_core.target import TargetModel
from dart_core.tree_search import SearchConfig
from tests.sampling_stats import chi2_pvalue, exact_joint, sample_through_the_loop
from dart_core.setup.tiny_models import plain_greedy_reference, random_head, tiny_target

needs_int8 = pytest.mark.skipif(int8_supported(tiny_target("llama").hardware,
                                               random_head(tiny_target("llama"))) is not None,
                                reason="this torch build has no quantized engine")


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", seed=3)


@needs_int8
def test_the_int8_copy_drafts_nearly_the_same_rows_and_leaves_the_head_alone(target):
    head = random_head(target, n_mask=3, seed=1, tie_output=False)   # its own output layer, int8 too
    before = {k: v.clone() for k, v in head.state_dict().items()}
    small = int8_copy(head)
    assert small is not head and int8_copy(head) is small                  # made once per head
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in before.items())
    assert type(small.lm_head).__module__.startswith("torch.ao.nn.quantized")
    gen = torch.Generator().manual_seed(0)
    features, embeds = torch.randn(6, 3 * target.hidden_size, generator=gen), torch.randn(6, target.hidden_size,
                                                                                       generator=gen)
    with torch.inference_mode():
        exact = head(features, embeds, DraftCache())
        approx = small(features, embeds, DraftCache())
    assert approx.shape == exact.shape
    assert torch.corrcoef(torch.stack([exact.flatten(), approx.flatten()]))[0, 1] > 0.99
    assert (exact.argmax(-1) == approx.argmax(-1)).float().mean() >= 0.75
    with torch.no_grad():
        head.lm_head.weight.mul_(2.0)                                       # the head changed: copied again
    assert int8_copy(head) is not small


@needs_int8
def test_greedy_output_does_not_depend_on_the_draft_kernels(target, one_thread):
    head = random_head(target, n_mask=3, seed=2, tie_output=False)
    for prompt in ([1, 5, 9, 13, 17], [1, 40, 41, 42, 40, 41, 42, 40]):
        reference = plain_greedy_reference(target, prompt, 24)
        for kernels in ("fp32", "int8"):
            dart = DartProposer(HeadDrafter(head, target, kernels), SearchConfig(node_budget=8))
            trace = run(target, dart, prompt, GenerationConfig(max_new_tokens=24))
            assert trace.output_ids == reference, kernels


@needs_int8
def test_sampling_with_an_int8_head_matches_the_target_distribution(one_thread):
    target = tiny_target("llama", vocab=8, hidden=32, layers=2, seed=11)
    with torch.no_grad():
        target.lm_head.weight.mul_(0.4)   # several tokens carry real probability
    sampling = SamplingConfig(temperature=1.0, top_p=0.95, top_k=3)
    prompt, n_tokens, n_runs = [3, 5, 7], 4, 400
    joint = exact_joint(target, prompt, sampling, n_tokens)
    dart = DartProposer(HeadDrafter(random_head(target, n_mask=1, seed=4, tie_output=False), target, "int8"),
                        SearchConfig(topk=3, beam_width=3, node_budget=6))
    stats = sample_through_the_loop(target, dart, prompt, sampling, n_tokens, n_runs)
    assert stats["accepted"] > n_runs / 4 and all(out in joint for out in stats["outputs"])
    assert chi2_pvalue(stats["outputs"], joint) > 1e-3


def test_int8_runs_only_where_it_can(target):
    head = random_head(target)
    assert int8_supported(target.hardware, head.to(torch.bfloat16)) is not None   # starts from fp32 only
    cuda = type(target.hardware)(device="cuda:0")
    assert "CPUs only" in int8_supported(cuda, random_head(target))
    bf16 = TargetModel(tiny_target("llama", seed=3).model.to(torch.bfloat16))
    with pytest.raises(ConfigError, match="int8 draft head cannot run here: int8 quantization starts from an fp32"):
        HeadDrafter(random_head(target).to(torch.bfloat16), bf16, "int8")
    with pytest.raises(ConfigError, match="unknown draft kernels 'fast'"):
        HeadDrafter(random_head(target), target, "fast")


def test_auto_takes_the_fastest_kernels_measured_and_int8_only_by_a_margin(target, tmp_path, monkeypatch):
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path))
    head = random_head(target, n_mask=3)
    assert draft_kernel_choice(head, target, "fp32") == DraftKernelChoice("fp32", "fp32 (--draft-kernels fp32)")
    with pytest.raises(ConfigError, match="auto, native, native-int8, int8, fp32"):
        draft_kernel_choice(head, target, "maybe")
    hardware = target.hardware
    if int8_supported(hardware, head) is not None:
        with pytest.raises(ConfigError, match="--draft-kernels int8"):
            draft_kernel_choice(head, target, "int8")
    else:
        assert draft_kernel_choice(head, target, "int8").int8
    # all four measured, as on a machine where all four run (the steps named, their times given)
    monkeypatch.setattr(calibration.draft_native, "unsupported", lambda h, hw: None)
    monkeypatch.setattr(calibration, "int8_supported", lambda hw, h: None)
    monkeypatch.setattr(calibration, "int8_copy", lambda h: "an int8 copy")
    seconds = {}
    forwards = []

    def timed(step, new_cache, config, before):
        before()     # each step timed after a target forward, as decoding runs it
        forwards.append(step)
        return seconds[step]
    monkeypatch.setattr(calibration, "time_drafting", timed)
    monkeypatch.setattr(calibration, "head_step", lambda h, out_weight=None, output=None:
                        ("int8" if h is not head else "fp32", None))
    monkeypatch.setattr(calibration, "native_step", lambda native: (native, None))
    monkeypatch.setattr(calibration.draft_native, "packed", lambda h, hw, out_weight=None, weights=torch.bfloat16:
                        "native-int8" if weights == torch.int8 else "native")
    seconds.update(fp32=0.010, native=0.003, int8=0.004)
    seconds["native-int8"] = 0.0029
    choice = draft_kernel_choice(head, target)
    assert len(forwards) == 4
    assert choice.kernels == "native" and choice.reason == (
        "native: the fastest here, a drafting step 3.0 ms in bf16 through our C layer, 2.9 ms in int8 through our C "
        "layer, 4.0 ms in int8, 10.0 ms in fp32")                   # int8 weights only by the margin
    seconds.update(native=0.009)     # cached: measured once
    assert draft_kernel_choice(head, target) == choice
    assert draft_kernel_choice(head, target, recalibrate=True).kernels == "native-int8"   # 2.9 <= 0.9 * 9.0
    seconds.update({"native-int8": 0.0085, "int8": 0.0086})   # int8 weights barely faster: not enough
    assert draft_kernel_choice(head, target, recalibrate=True).kernels == "native"


def test_a_drafting_step_is_timed_after_what_runs_before_it():
    target = tiny_target("llama", seed=4)
    head = random_head(target, n_mask=3)
    calls = []
    step = lambda features, embeds, cache: calls.append(len(features))   # noqa: E731
    time_drafting(step, DraftCache, head.config, committed=2, context=8, rounds=3,
                  before=lambda: calls.append("before"))
    assert calls == [8, "before", 2] * 4     # the warm-up and three rounds, each timed step after `before`
