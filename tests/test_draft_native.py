"""The draft head's C layer (dart_core.draft_native): its drafting step computes what the head computes in torch on
the same (bf16) weights, over a run of steps, for every kind of head; decoding with it stays token-identical to plain
decoding; and where it cannot run, the reason is said."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import pytest
import torch

from dart_core import draft_native
from dart_core.decoding import GenerationConfig, run
from dart_core.draft_head import DraftCache
from dart_core.errors import ConfigError
from dart_core.machine import few_rows
from dart_core.machine.hardware import Hardware
from dart_core.proposers import DartProposer, Drafter, HeadDrafter
from dart_core.setup.tiny_models import plain_greedy_reference, random_head, tiny_target
from dart_core.target import TargetModel
from dart_core.tree_search import SearchConfig
from tests.head_kinds import HEAD_KINDS, head_of_kind


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", seed=3)


def runs_here(target, head) -> bool:
    why = draft_native.unsupported(head, target.hardware)
    if why is not None:   # no C compiler here: the reason is said, and the head drafts through torch
        assert few_rows.why_not(target.hardware.kind) and "not built" in why
    return why is None


def rounded(head):
    """`head` with its linears' weights rounded to bf16, as the C layer reads them (the rest it reads in fp32)."""
    out = copy.deepcopy(head)
    with torch.no_grad():
        for module in out.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(module.weight.bfloat16().float())
    return out


@pytest.mark.parametrize("tiles", ["off", "stand-in", "avx512-bf16"])
@pytest.mark.parametrize("overrides", HEAD_KINDS)
def test_its_steps_compute_what_the_head_computes(target, overrides, tiles):
    """Its logits are the head's on its bf16 weights; with the products from tiles (by their stand-in, or by
    AVX512-BF16: its arithmetic written out where the build has none) each product's input is rounded to bf16 too, and
    they stay near."""
    head = head_of_kind(target, overrides)
    if not runs_here(target, head):
        return
    reference = rounded(head)
    out_weight = head.tied_output(target.lm_head.weight)
    native = draft_native.packed(head, target.hardware, out_weight, tiles=tiles)
    on_tiles = tiles != "off"
    assert native.tiles == (tiles if on_tiles else "")
    near = 2e-2 if on_tiles else 1e-4
    gen = torch.Generator().manual_seed(1)
    H = target.hidden_size
    features, embeds = torch.randn(60, 3 * H, generator=gen), torch.randn(60, H, generator=gen)
    ours, theirs = native.new_cache(), DraftCache()
    # a prompt, then steps of 1-3 committed tokens, past the cache's first capacity (draft_native.MIN_CACHE)
    bounds = [0, 20, 21, 23, 26, 27, 60]
    with torch.inference_mode():
        for a, b in zip(bounds, bounds[1:]):
            tied = None if out_weight is None else out_weight.bfloat16().float()   # read in bf16 too
            expected = reference(features[a:b], embeds[a:b], theirs, tied)
            got = native.step(features[a:b], embeds[a:b], ours)
            assert got.shape == expected.shape == (4, head.config.out_vocab)
            assert torch.allclose(got, expected, atol=near, rtol=near), (a, b)
            assert on_tiles == bool((got - expected).abs().max() > 1e-4)   # on tiles, the inputs' rounding shows
            assert ours.length == theirs.length == b


def test_its_int8_weights_draft_nearly_the_same_rows(target):
    head = random_head(target, n_mask=3, seed=7, tie_output=False)
    if not runs_here(target, head):
        return
    gen = torch.Generator().manual_seed(3)
    H = target.hidden_size
    features, embeds = torch.randn(12, 3 * H, generator=gen), torch.randn(12, H, generator=gen)
    exact = draft_native.packed(head, target.hardware)
    small = draft_native.packed(head, target.hardware, weights=torch.int8)
    assert small is not exact and draft_native.packed(head, target.hardware, weights=torch.int8) is small
    a, b = exact.step(features, embeds, exact.new_cache()), small.step(features, embeds, small.new_cache())
    assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > 0.999
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.75
    dart = DartProposer(HeadDrafter(head, target, "native-int8"), SearchConfig(node_budget=8))
    prompt = [1, 40, 41, 42, 40, 41, 42, 40]
    assert run(target, dart, prompt, GenerationConfig(max_new_tokens=16)).output_ids == \
        plain_greedy_reference(target, prompt, 16)


@contextmanager
def torch_threads(n: int):
    kept = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(kept)


def test_the_searchs_rows_are_torchs_top_k_and_softmax(target):
    """The rows the tree search reads, taken by our C code from the head's logits: each row's top k in torch's order
    (the earlier of equal logits first, a NaN last), their softmax over the k, the ids mapped to the target's."""
    head = random_head(target, n_mask=3, seed=4, tie_output=False, draft_vocab_size=50)
    if not runs_here(target, head):
        return
    drafter = HeadDrafter(head, target, "native")
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 50, generator=gen)
    logits[1] = torch.randint(0, 4, (50,), generator=gen).float()     # many equal logits
    logits[2, 7], logits[3] = float("nan"), float("-inf")
    logits[3, 30] = 1.0
    for k, threads in [(1, 2), (5, 1), (16, 2), (50, 2), (50, 1)]:   # rows shared among threads, or on one
        with torch_threads(threads):
            ids, probs = drafter.top_rows(logits, k)
        values, order = torch.sort(torch.nan_to_num(logits, nan=float("-inf")), dim=-1, descending=True, stable=True)
        assert ids.shape == probs.shape == (4, k)
        assert (ids[[0, 1, 2]] == head.d2t[order[[0, 1, 2], :k]].numpy()).all(), k
        assert ids[3, 0] == int(head.d2t[30])
        expected = values[:3, :k].softmax(-1).numpy()
        assert abs(probs[:3] - expected).max() < 1e-6 and abs(probs.sum(-1)[:3] - 1).max() < 1e-5
    torch_ids, torch_probs = Drafter.top_rows(drafter, logits[:1], 16)   # the generic path: the same rows
    assert (torch_ids == drafter.top_rows(logits[:1], 16)[0]).all()
    assert abs(torch_probs - drafter.top_rows(logits[:1], 16)[1]).max() < 1e-6


def test_the_cache_grows_and_keeps_what_it_holds(target):
    head = random_head(target, n_mask=2, seed=6, tie_output=False)
    if not runs_here(target, head):
        return
    native = draft_native.packed(head, target.hardware)
    assert draft_native.packed(head, target.hardware) is native        # packed once per head
    gen = torch.Generator().manual_seed(2)
    H, n = target.hidden_size, draft_native.MIN_CACHE + 40
    features, embeds = torch.randn(n, 3 * H, generator=gen), torch.randn(n, H, generator=gen)
    whole, stepped = native.new_cache(), native.new_cache()
    at_once = native.step(features, embeds, whole)
    native.step(features[:-1], embeds[:-1], stepped)
    assert torch.allclose(native.step(features[-1:], embeds[-1:], stepped), at_once, atol=1e-4, rtol=1e-4)
    assert stepped.capacity >= n and stepped.length == whole.length == n
    with torch.no_grad():
        head.lm_head.weight.mul_(2.0)                                      # the head changed: packed again
    assert draft_native.packed(head, target.hardware) is not native


def test_greedy_output_with_the_c_layer_is_plain_decodings(target, one_thread):
    head = random_head(target, n_mask=3, seed=2, tie_output=False)
    if not runs_here(target, head):
        return
    for prompt in ([1, 5, 9, 13, 17], [1, 40, 41, 42, 40, 41, 42, 40]):
        dart = DartProposer(HeadDrafter(head, target, "native"), SearchConfig(node_budget=8))
        trace = run(target, dart, prompt, GenerationConfig(max_new_tokens=24))
        assert trace.output_ids == plain_greedy_reference(target, prompt, 24)


def test_where_it_cannot_run_it_says_why(target):
    head = random_head(target)
    assert "not built" in draft_native.unsupported(head, target.hardware.without("few_rows"))
    stand_in = target.hardware.without("few_rows").with_stand_ins("few_rows")
    assert "not built" in draft_native.unsupported(head, stand_in)   # a stand-in serves linears, not this layer
    assert "on a CPU" in draft_native.unsupported(head, Hardware(device="cuda:0", few_rows=True))
    elsewhere = TargetModel(target.model, hardware=target.hardware.without("few_rows"))
    with pytest.raises(ConfigError, match="the C layer cannot draft here: our kernels are not built here"):
        HeadDrafter(head, elsewhere, "native")
