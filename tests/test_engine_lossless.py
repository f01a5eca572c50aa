"""Greedy DART / prompt lookup / vanilla decoding are token-identical to plain greedy decoding (fp32)."""

import pytest

from dart_core.budget.auto import AutoBudget
from dart_core.decoding import GenerationConfig, run
from dart_core.forensics.replay import replay_step
from dart_core.machine.records import CostCurve
from dart_core.metrics import Metrics
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer, HeadDrafter, PromptLookupProposer, VanillaProposer
from dart_core.tree_search import SearchConfig, search
from dart_core.setup.tiny_models import OracleDrafter, plain_greedy_reference, random_head, tiny_target
from dart_core.setup.tiny_models import random_prompts as prompts

KNOBS = {
    "budget1": SearchConfig(node_budget=1),
    "default": SearchConfig(),
    "large": SearchConfig(node_budget=200, beam_width=30, topk=30),
}


@pytest.fixture(scope="module")
def llama():
    return tiny_target("llama")


@pytest.fixture(scope="module")
def references(llama):
    return {tuple(p): plain_greedy_reference(llama, p, 24) for p in prompts(20, llama.vocab_size)}


@pytest.mark.parametrize("knobs", list(KNOBS))
def test_dart_random_head_is_lossless(llama, references, knobs):
    ngram = NGramModel.build(prompts(50, llama.vocab_size, seed=9), vocab_size=llama.vocab_size, order=3)
    proposer = DartProposer(HeadDrafter(random_head(llama), llama), KNOBS[knobs], ngram)
    cfg = GenerationConfig(max_new_tokens=24)
    for prompt, expected in references.items():
        trace = run(llama, proposer, list(prompt), cfg)
        assert trace.output_ids == expected
        assert all(len(s.tree) - 1 <= KNOBS[knobs].node_budget for s in trace.steps[1:])


@pytest.mark.parametrize("knobs", list(KNOBS))
def test_dart_oracle_head_is_lossless_and_reaches_max_tau(llama, references, knobs):
    n_rows = 4
    proposer = DartProposer(OracleDrafter(llama, n_rows), KNOBS[knobs])
    most = 1 if knobs == "budget1" else n_rows  # drafts a step can carry: the node budget or the rows
    metrics = Metrics()
    for prompt, expected in list(references.items())[:8]:
        trace = run(llama, proposer, list(prompt), GenerationConfig(max_new_tokens=24))
        assert trace.output_ids == expected
        # every draft is right: each step accepts all it can, and only the token limit cuts the last one
        assert all(s.accepted == most for s in trace.steps[1:-1])
        for step in trace.steps:
            metrics.observe(step)
    # 23 tokens after the prefill's: (most + 1) per step, the last step cut to what is left
    steps_per_prompt = -(-23 // (most + 1))
    assert metrics.tau == pytest.approx(23 / steps_per_prompt)
    print(f"oracle tau ({knobs}): {metrics.tau:.3f}, maximum {most + 1}")


def test_prompt_lookup_and_vanilla_are_lossless(llama, references):
    for proposer in (PromptLookupProposer(), PromptLookupProposer(max_ngram=2, num_tokens=3), VanillaProposer()):
        for prompt, expected in references.items():
            assert run(llama, proposer, list(prompt), GenerationConfig(max_new_tokens=24)).output_ids == expected


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_other_families(family):
    target = tiny_target(family, seed=3)
    proposer = DartProposer(HeadDrafter(random_head(target, seed=1), target), SearchConfig(node_budget=30))
    oracle = DartProposer(OracleDrafter(target, 3))
    for prompt in prompts(5, target.vocab_size, seed=4):
        expected = plain_greedy_reference(target, prompt, 16)
        assert run(target, proposer, prompt, GenerationConfig(max_new_tokens=16)).output_ids == expected
        assert run(target, oracle, prompt, GenerationConfig(max_new_tokens=16)).output_ids == expected


def test_stops_on_any_stop_id(llama, references):
    prompt, expected = next(iter(references.items()))
    stop = {expected[5], expected[9]}
    first = min(i for i, t in enumerate(expected) if t in stop)
    for proposer in (VanillaProposer(), DartProposer(OracleDrafter(llama, 4))):
        trace = run(llama, proposer, list(prompt), GenerationConfig(max_new_tokens=24, stop_ids=frozenset(stop)))
        assert trace.output_ids == expected[: first + 1]
        assert trace.steps[-1].stop_reason == "stop_token"


def test_max_new_tokens_is_exact(llama, references):
    prompt, expected = next(iter(references.items()))
    for n in (1, 2, 7):
        trace = run(llama, DartProposer(OracleDrafter(llama, 4)), list(prompt), GenerationConfig(max_new_tokens=n))
        assert trace.output_ids == expected[:n] and trace.steps[-1].stop_reason == "max_new_tokens"


def test_dart_with_context_adaptive_ngram_is_lossless(llama, references):
    from dart_core.context_ngram import ContextNGram

    ngram = ContextNGram(NGramModel.build(prompts(20, llama.vocab_size, seed=5), vocab_size=llama.vocab_size))
    proposer = DartProposer(HeadDrafter(random_head(llama, seed=2), llama), SearchConfig(node_budget=16), ngram)
    for prompt, expected in list(references.items())[:10]:
        assert run(llama, proposer, list(prompt), GenerationConfig(max_new_tokens=24)).output_ids == expected
        assert ngram.seen[: len(prompt)] == list(prompt)  # it counted this prompt, not the previous one


def test_dart_without_its_candidates_recorded_drafts_the_same_trees_and_learns_its_budget(llama, references):
    """Only the app and the traces need every candidate the search weighed: without them a step keeps its tree, and
    the automatic budget learns from the search's own columns what it learnt from the recorded candidates."""
    ngram = NGramModel.build(prompts(50, llama.vocab_size, seed=9), vocab_size=llama.vocab_size, order=3)
    curve = CostCurve((1, 8, 64), (1000.0, 1100.0, 2000.0))   # the drafting time measured weighs nothing
    runs = {}
    for record in (True, False):
        auto = AutoBudget(curve, start=6, max_budget=20)
        proposer = DartProposer(HeadDrafter(random_head(llama, seed=5), llama), SearchConfig(node_budget=6), ngram,
                                lookup=PromptLookupProposer(max_ngram=2, num_tokens=4), auto_budget=auto,
                                record_candidates=record)
        proposer.observe = lambda tokens, seconds: None   # the curve as given: choices that do not depend on timing
        traces = [run(llama, proposer, list(p), GenerationConfig(max_new_tokens=24)) for p in list(references)[:6]]
        drafted = [s for t in traces for s in t.steps[1:] if s.rows_tokens is not None]
        assert drafted and all((s.candidates is not None) == record for s in drafted)
        if record:   # made once the verify was under way, the record is the step's own search's
            for t in traces:
                for i, s in enumerate(t.steps[1:], start=1):
                    if s.rows_tokens is not None:
                        again = search(s.rows_tokens, s.rows_probs, replay_step(t, i).context,
                                       SearchConfig(node_budget=s.budget.nodes), ngram)
                        assert again.candidates.to_dict() == s.candidates.to_dict()
        runs[record] = ([t.output_ids for t in traces], [(s.tree.tokens, s.tree.parents) for s in drafted],
                        auto.steps, auto.accepted.tolist(), auto.nodes.tolist())
    assert runs[True][0] == [references[tuple(p)] for p in list(references)[:6]]
    assert runs[True][2] > 0 and runs[False] == runs[True]


def test_dart_with_a_prompt_lookup_branch_is_lossless_and_uses_the_branch(llama, references):
    lookup = PromptLookupProposer(max_ngram=2, num_tokens=4)
    proposer = DartProposer(HeadDrafter(random_head(llama, seed=3), llama), SearchConfig(node_budget=6),
                            lookup=lookup)
    accepted_from_lookup = 0
    for prompt, expected in references.items():
        trace = run(llama, proposer, list(prompt), GenerationConfig(max_new_tokens=24))
        assert trace.output_ids == expected
        for step in trace.steps[1:]:
            assert len(step.tree) - 1 - len(step.lookup_nodes) <= 6 and len(step.lookup_nodes) <= 4
            accepted_from_lookup += len(set(step.path) & set(step.lookup_nodes))
    # a random head rarely guesses right; the copied branch does on these repetitive outputs
    assert accepted_from_lookup > 0
