"""The draft head's step at fixed shapes (dart_core.draft_fixed), what a GPU captures as CUDA graphs: run eagerly on
the CPU, and captured with the capture played on the CPU, it computes what the head's own forward computes, over
prompts longer than any bucket, steps of every bucket and a cache that grows (its buckets captured anew, all at
once); a decode reuses its cache and buckets; where the target's steps run at their own shapes, the head's do too."""

from __future__ import annotations

import pytest
import torch

from dart_core.decoding import GenerationConfig, run
from dart_core.draft_fixed import BUCKETS, FixedDraft
from dart_core.draft_head import DraftCache
from dart_core.lean_forward import CUDA, EAGER, OFF
from dart_core.proposers import DartProposer, HeadDrafter
from dart_core.setup.tiny_models import plain_greedy_reference, random_head, tiny_target
from dart_core.setup.tiny_models import random_prompts as prompts
from dart_core.tree_search import SearchConfig
from tests.graph_standin import play_captures
from tests.head_kinds import HEAD_KINDS, head_of_kind


@pytest.fixture(scope="module")
def target():
    t = tiny_target("llama", seed=3)
    assert t.use_lean() is None
    t.lean.native, t.lean.graphs = None, EAGER    # the fixed shapes, run eagerly
    return t


@pytest.mark.parametrize("graphs", [EAGER, CUDA])   # CUDA: captured as on a GPU, the captures played on the CPU
@pytest.mark.parametrize("overrides", HEAD_KINDS)
def test_its_steps_compute_what_the_head_computes(target, overrides, graphs, monkeypatch):
    captured = play_captures(monkeypatch)
    head = head_of_kind(target, overrides)
    out_weight = head.tied_output(target.lm_head.weight)
    fixed = FixedDraft(head, out_weight, graphs=graphs, capacity=24)
    gen = torch.Generator().manual_seed(1)
    H = target.hidden_size
    features, embeds = torch.randn(80, 3 * H, generator=gen), torch.randn(80, H, generator=gen)
    ours, theirs = fixed.new_cache(), DraftCache()
    capacities = {ours.capacity}
    # a prompt longer than any bucket, then steps of 1-16 new positions (every bucket, padded or full) and one longer
    # again, past the cache's first capacity
    bounds = [0, 20, 21, 24, 26, 27, 43, 48, 56, 57, 80]
    steps = [b - a for a, b in zip(bounds, bounds[1:])]
    assert {1, 2, 3, 5, 8, BUCKETS[-1]} <= set(steps) and steps[-1] > BUCKETS[-1]
    with torch.inference_mode():
        for a, b in zip(bounds, bounds[1:]):
            expected = head(features[a:b], embeds[a:b], theirs, out_weight)
            got = fixed.step(features[a:b], embeds[a:b], ours)
            assert got.shape == expected.shape == (4, head.config.out_vocab)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            assert ours.length == theirs.length == b
            capacities.add(ours.capacity)
    assert ours.capacity >= 80 + BUCKETS[-1] and set(fixed.buckets) <= set(BUCKETS)
    # captured: every bucket when the cache was made and again as it grew (twice here), never in between
    assert len(captured) == (len(BUCKETS) * len(capacities) if graphs == CUDA else 0) and len(capacities) >= 3
    assert graphs == EAGER or sum(g.replays for g in captured) >= len(bounds) - 3   # bucket-sized steps replayed


def test_a_decode_drafts_at_fixed_shapes_losslessly_and_reuses_its_cache(target, one_thread):
    proposer = DartProposer(HeadDrafter(random_head(target), target), SearchConfig(node_budget=12))
    fixed = proposer.drafter.fixed
    assert fixed is not None and fixed.graphs == EAGER
    prompt = prompts(1, target.vocab_size, seed=3)[0]
    first = run(target, proposer, prompt, GenerationConfig(max_new_tokens=16))
    assert first.output_ids == plain_greedy_reference(target, prompt, 16)
    cache, buckets = fixed.cache, dict(fixed.buckets)
    assert buckets and set(buckets) <= set(BUCKETS)
    again = run(target, proposer, prompt, GenerationConfig(max_new_tokens=16))
    assert again.output_ids == first.output_ids
    assert fixed.cache is cache and all(fixed.buckets[b] is buckets[b] for b in buckets)   # nothing made again


def test_a_cache_it_did_not_make_is_refused(target):
    fixed = FixedDraft(random_head(target), target.lm_head.weight, graphs=EAGER)
    fixed.new_cache()
    other = FixedDraft(random_head(target), target.lm_head.weight, graphs=EAGER).new_cache()
    with pytest.raises(ValueError, match="the cache it made"):
        fixed.step(torch.zeros(1, 3 * target.hidden_size), torch.zeros(1, target.hidden_size), other)


def test_where_the_targets_steps_take_their_own_shapes_the_heads_do_too():
    t = tiny_target("llama", seed=3)
    t.use_lean()
    t.lean.native, t.lean.graphs = None, OFF
    assert HeadDrafter(random_head(t), t).fixed is None
    assert HeadDrafter(random_head(tiny_target("llama", seed=3)), tiny_target("llama", seed=3)).fixed is None
