"""The lean forward over a static cache (dart_core.lean_forward): the same logits and features as transformers'
forward, and greedy decoding through it token-identical to plain decoding, for every family it takes."""

from __future__ import annotations

import pytest
import torch

from dart_core.decoding import GenerationConfig, run
from dart_core.machine.kernels import measure_plan
from dart_core import draft_fixed
from dart_core.fixed_step import FIXED_BUCKETS, FixedStep, sees
from dart_core.lean_forward import CUDA, EAGER, LeanForward, StaticKV
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer, HeadDrafter, PromptLookupProposer, VanillaProposer
from dart_core.setup import loading
from dart_core.setup.tiny_models import OracleDrafter, plain_greedy_reference, random_head, tiny_target
from dart_core.tree import TokenTree
from dart_core.tree_search import SearchConfig
from dart_core.setup.tiny_models import random_prompts as prompts
from tests.device_reads import DeviceWork
from tests.graph_standin import CapturableOnly, ReplayedOnTheCpu, play_captures
from tests.lean_pairs import NATIVE, STEPS, lean_pair

FAMILIES = ("llama", "qwen2", "qwen3")
def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("graphs", STEPS)
@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_tree_verify_and_commit_match_transformers_forward(family, graphs, one_thread):
    plain, lean = lean_pair(family, graphs=graphs)
    ids = list(range(5, 25))
    caches = plain.new_cache(), lean.new_cache(capacity=8)           # too small: the static cache grows
    assert isinstance(caches[1], StaticKV) and not isinstance(caches[0], StaticKV)
    (la, fa), (lb, fb) = (t.prefill(ids, c, features=True) for t, c in zip((plain, lean), caches))
    close(la, lb), close(fa, fb)
    assert caches[1].get_seq_length() == len(ids) and caches[1].capacity >= len(ids)

    tree = TokenTree([7, 8, 9, 10, 11, 12], [-1, 0, 0, 1, 2, 4])
    (la, fa), (lb, fb) = (t.verify(tree, c, features=True) for t, c in zip((plain, lean), caches))
    close(la, lb), close(fa, fb)
    for t, c in zip((plain, lean), caches):    # keep a path that is not a prefix: entries move on the device
        t.commit(c, len(ids), [0, 2, 4, 5])
    (la, _), (lb, _) = (t.verify(TokenTree.chain(3, [4, 5]), c) for t, c in zip((plain, lean), caches))
    close(la, lb)
    assert caches[1].get_seq_length() == len(ids) + 4 + 3


def test_weights_changed_in_place_are_read_from_the_next_decode_on():
    """The lean forward decodes from copies of the weights (fused, packed for the C layer): a model changed in place
    after loading (a fine-tune step, an edit) gets them made again, not stale logits."""
    plain, lean = lean_pair("qwen3", graphs=NATIVE)
    for target in (plain, lean):
        with torch.no_grad():
            for name, p in target.model.named_parameters():
                if "down_proj" in name or "k_proj" in name:
                    p.mul_(1.5)
    caches = plain.new_cache(), lean.new_cache()
    ids, tree = list(range(5, 25)), TokenTree([7, 8, 9, 10], [-1, 0, 0, 1])
    for method, args in (("prefill", (ids,)), ("verify", (tree,))):
        (la, _), (lb, _) = (getattr(t, method)(*args, c) for t, c in zip((plain, lean), caches))
        close(la, lb)
    with torch.inference_mode():          # weights without version counters (loaded inside inference mode)
        frozen = tiny_target("qwen3", seed=3)
    assert frozen.use_lean() is None and isinstance(frozen.new_cache(), StaticKV)


def test_the_static_cache_refuses_edits_outside_what_it_holds():
    cache = StaticKV(layers=2, kv_heads=1, head_dim=4, capacity=4, dtype=torch.float32, device="cpu")
    cache.length = 3
    with pytest.raises(ValueError, match="roll back"):
        cache.rollback(4)
    with pytest.raises(ValueError, match="outside the verified block"):
        cache.keep(1, [0, 2])
    cache.reserve(9)
    assert cache.capacity == 9 and cache.length == 3


@pytest.mark.parametrize("graphs", STEPS)
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_dart_lookup_and_plain_decoding_through_it_are_lossless(family, graphs, one_thread):
    _, lean = lean_pair(family, seed=4, graphs=graphs)
    ngram = NGramModel.build(prompts(30, lean.vocab_size, seed=9), vocab_size=lean.vocab_size, order=3)
    proposers = [VanillaProposer(), PromptLookupProposer(),
                 DartProposer(HeadDrafter(random_head(lean), lean), SearchConfig(node_budget=24), ngram),
                 DartProposer(OracleDrafter(lean, 4), SearchConfig(node_budget=8))]
    for prompt in prompts(6, lean.vocab_size, seed=1):
        expected = plain_greedy_reference(lean, prompt, 20)
        for proposer in proposers:
            assert run(lean, proposer, prompt, GenerationConfig(max_new_tokens=20)).output_ids == expected, \
                proposer.name


def test_the_kernel_plan_chooses_for_the_fused_projections_and_stays_lossless(capable):
    target = tiny_target("llama", seed=6)
    target.hardware = capable
    target.use_lean(graphs=False)      # torch operations: the plan chooses their kernels (the C layer has its own)
    linears = target.planned_linears()
    assert {tuple(m.weight.shape) for m in linears} >= {(64 + 2 * 32, 64), (2 * 128, 64)}   # qkv, gate+up
    target.use_kernels(measure_plan(linears, capable, rounds=1))
    proposer = DartProposer(HeadDrafter(random_head(target), target), SearchConfig(node_budget=16))
    for prompt in prompts(4, target.vocab_size, seed=2):
        assert run(target, proposer, prompt, GenerationConfig(max_new_tokens=16)).output_ids == \
            plain_greedy_reference(target, prompt, 16)


def test_models_the_lean_forward_does_not_know_keep_transformers_forward(monkeypatch):
    target = tiny_target("qwen3", seed=1)
    target.model.config.layer_types = ["sliding_attention"] * target.num_layers
    assert "sliding-window" in target.use_lean() and target.forward_kind == "transformers"
    target.model.config.layer_types = ["full_attention"] * target.num_layers
    target.model.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert "rotary scaling 'dynamic'" in LeanForward.unsupported(target.model)
    target.model.config.model_type = "gpt_neox"
    assert "model type" in LeanForward.unsupported(target.model)
    assert "off by request" == tiny_target("llama").use_lean(False)
    monkeypatch.setenv(loading.FORWARD_ENV, "fastest")
    with pytest.raises(loading.SetupError, match="unknown forward 'fastest'"):
        loading.chosen_forward(None)
    monkeypatch.setenv(loading.FORWARD_ENV, "transformers")
    assert loading.chosen_forward(None) == "transformers" and loading.chosen_forward("lean") == "lean"


def test_a_decode_hands_its_cache_back_with_its_fixed_step_for_the_next_one(one_thread):
    _, lean = lean_pair("llama", graphs=EAGER)
    proposer = DartProposer(HeadDrafter(random_head(lean), lean), SearchConfig(node_budget=12))
    prompt = prompts(1, lean.vocab_size, seed=3)[0]
    first = run(lean, proposer, prompt, GenerationConfig(max_new_tokens=12))
    (cache,) = lean.lean._free
    buckets = cache.fixed.buckets
    assert buckets and set(buckets) <= set(FIXED_BUCKETS)
    steps = run(lean, proposer, prompt, GenerationConfig(max_new_tokens=12))
    assert steps.output_ids == first.output_ids
    assert lean.lean._free == [cache] and cache.fixed.buckets is buckets  # reused: nothing prepared again

    stream = iter(run.__globals__["generate"](lean, proposer, prompt, GenerationConfig(max_new_tokens=12)))
    next(stream)
    assert lean.lean._free == []          # in use
    stream.close()                         # a caller that stops early (the app's stop button)
    assert lean.lean._free == [cache]


def test_the_capture_check_refuses_what_a_graph_cannot_capture():
    x = torch.arange(6.0)
    for refused in (lambda: float(x[0]), lambda: x[x > 2], lambda: torch.tensor([1, 2]), lambda: x[[0, 1]],
                    lambda: bool(x[1] > 0), lambda: x.nonzero()):
        with pytest.raises(AssertionError, match="cannot capture"), CapturableOnly():
            refused()
    with CapturableOnly():   # what a step does
        x.index_select(0, torch.arange(2)).sum() * 2.0 + x.index_copy(0, torch.arange(2), x[:2])


def test_steps_captured_once_and_replayed_decode_losslessly(one_thread, monkeypatch):
    """The GPU path's logic (static inputs filled before a replay, the capture's outputs read after it), with the
    graph played by a stand-in, since this machine may have no CUDA."""
    graphs = play_captures(monkeypatch)
    _, lean = lean_pair("qwen3", seed=5, graphs=CUDA)
    proposer = DartProposer(HeadDrafter(random_head(lean), lean), SearchConfig(node_budget=12))
    for prompt in prompts(4, lean.vocab_size, seed=6):
        for p in (VanillaProposer(), proposer):
            assert run(lean, p, prompt, GenerationConfig(max_new_tokens=16)).output_ids == \
                plain_greedy_reference(lean, prompt, 16), p.name
    # one capture per bucket of each cache (a longer prompt takes a larger cache), and of the head's steps (one
    # cache for every decode); every other step a replay
    drafted = proposer.drafter.fixed.buckets
    assert drafted and len(graphs) == sum(len(c.fixed.buckets) for c in lean.lean._free) + len(drafted)
    assert all(b.graph is not None for b in drafted.values())
    assert sum(g.replays for g in graphs) > 4 * 16 // 2


def test_graphs_are_captured_in_the_first_decode_and_serve_prompts_of_every_length(one_thread, monkeypatch):
    """Every bucket is captured when a cache first steps, the head's when its cache is made, and caches are sized to
    serve prompts of any length up to hundreds of tokens: after the first decode nothing is captured, so no later run
    (a bench's timed ones) pays for a capture."""
    graphs = play_captures(monkeypatch)
    _, lean = lean_pair("qwen3", seed=5, graphs=CUDA)
    proposers = (VanillaProposer(), DartProposer(HeadDrafter(random_head(lean), lean), SearchConfig(node_budget=12)))
    first = len(prompts(1, lean.vocab_size, seed=6)[0])
    for length in (first, 60, 150, 300):   # each longer than the last
        prompt = prompts(1, lean.vocab_size, seed=length)[0] * (length // first + 1)
        for p in proposers:
            run(lean, p, prompt[:length], GenerationConfig(max_new_tokens=12))
            if length == first and p is proposers[0]:
                captured = len(graphs)
    assert captured == len(FIXED_BUCKETS) + len(draft_fixed.BUCKETS)   # the target's and the head's, all at once
    assert len(graphs) == captured


def test_a_bucket_sees_the_cache_its_block_and_padded_rows_themselves():
    gen = torch.Generator().manual_seed(0)
    for bucket, past, n in ((1, 0, 1), (4, 5, 3), (8, 0, 8), (8, 9, 1), (16, 30, 11)):
        block = torch.rand(bucket, bucket, generator=gen) < 0.5
        block[n:] = block[:, n:] = False   # as the step's host buffer holds it: nothing past the real rows
        span = past + bucket + 3
        expected = torch.zeros(bucket, span, dtype=torch.bool)
        for r in range(bucket):
            if r < n:
                expected[r, :past] = True
                expected[r, past: past + n] = block[r, :n]
            else:
                expected[r, past + r] = True
        assert torch.equal(sees(block, torch.tensor(past), torch.tensor(n), span), expected), (bucket, past, n)


def test_outside_its_captured_steps_a_decode_step_launches_a_few_operations(one_thread, monkeypatch):
    """On a GPU each operation outside a graph is a launch of its own from Python: a step's inputs go in two copies
    (the target's) and three (the head's), and what the step needs of them it computes inside its graph."""
    play_captures(monkeypatch)
    _, lean = lean_pair("qwen3", seed=5, graphs=CUDA)
    head = random_head(lean)
    proposer = DartProposer(HeadDrafter(head, lean), SearchConfig(node_budget=12))
    prompt = prompts(1, lean.vocab_size, seed=6)[0]
    work = DeviceWork()
    for step, name in ((FixedStep, "_step"), (draft_fixed.FixedDraft, "_compute"), (ReplayedOnTheCpu, "replay")):
        inner = getattr(step, name)

        def captured(*args, inner=inner, **kwargs):
            work.captured += 1
            try:
                return inner(*args, **kwargs)
            finally:
                work.captured -= 1
        monkeypatch.setattr(step, name, captured)
    per_step = {}
    for p in (VanillaProposer(), proposer):
        run(lean, p, prompt, GenerationConfig(max_new_tokens=4))   # the caches made, every bucket captured
        work.on_device(*(b for c in lean.lean._free for s in c.fixed.buckets.values() for b in (s.inputs, s.block)),
                       *(c.kv for c in lean.lean._free))
        if p is proposer:
            fixed = proposer.drafter.fixed
            work.on_device(fixed.cache.kv, *(t for b in fixed.buckets.values() for t in (b.features, b.embeds,
                                                                                          b.sizes)))
        work.reads.clear()
        with work:
            trace = run(lean, p, prompt, GenerationConfig(max_new_tokens=16))
        per_step[p.name] = sum(work.reads.values()) / len(trace.steps)   # the prompt's step too
    # before, the inputs were written into the device's buffers piece by piece: 10 launches a plain step, 32 a DART one
    assert per_step["vanilla"] <= 3 and per_step["dart"] <= 15, per_step
