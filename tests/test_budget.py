"""The automatic node budget: its per-budget acceptance is exactly what the search would have built and the target
accepted, it trades tokens for the machine's verify cost, and decoding with it stays lossless."""

from __future__ import annotations

import numpy as np
import pytest

from dart_core.budget import PLAIN_MARGIN, AutoBudget
from dart_core.decoding import GenerationConfig, run
from dart_core.metrics import Metrics
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer, HeadDrafter, PromptLookupProposer
from dart_core.setup.calibration import CostCurve
from dart_core.tree_search import SearchConfig, search
from tests.tiny import OracleDrafter, plain_greedy_reference, random_head, tiny_target

FLAT = CostCurve((1, 64), (0.01, 0.01))            # nodes cost nothing: the largest tree is best
STEEP = CostCurve((1, 2, 64), (0.01, 0.03, 1.0))   # every node costs two steps: plain chains win


def random_rows(rng, rows=4, k=6, vocab=40):
    tokens = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(rows)]).astype(np.int64)
    probs = rng.dirichlet(np.ones(k), size=rows)
    return tokens, -np.sort(-probs, axis=1)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_branch", [False, True])
def test_acceptance_per_budget_is_what_the_search_would_have_given(seed, with_branch):
    rng = np.random.default_rng(seed)
    table = NGramModel.build([rng.integers(0, 40, 300).tolist()], vocab_size=40, order=3)
    rows_tokens, rows_probs = random_rows(rng)
    context = [3, 7, 11]
    cfg = SearchConfig(topk=6, beam_width=4, node_budget=60)
    pool = search(rows_tokens, rows_probs, context, cfg, table).candidates
    # the target's continuation: along the pool for a few levels (a random depth), then off it
    target = [int(t) for t in rows_tokens[np.arange(4), rng.integers(0, 3, 4)]]
    branch = [target[0], target[1], 39] if with_branch else []
    auto = AutoBudget(FLAT, start=4, max_budget=30)
    auto.remember(context, pool, branch, 0.001)
    auto.budget_for(context + target)          # the continuation is known: the step settles
    assert auto.steps == 1 and not auto.pending
    for b in range(1, 31):
        tree = search(rows_tokens, rows_probs, context, SearchConfig(topk=6, beam_width=4, node_budget=b),
                      table).tree
        if branch:
            tree, _ = tree.with_branch(branch, len(branch))
        path, _ = tree.follow(target)
        assert auto.accepted[b] == len(path) - 1, b
        assert auto.nodes[b] == len(tree) - 1, b


def test_the_choice_follows_the_cost_curve():
    rng = np.random.default_rng(1)
    rows_tokens, rows_probs = random_rows(rng)
    target = [int(t) for t in rows_tokens[:, 0]]                      # the draft's argmax chain is right
    context = [1, 2]
    cfg = SearchConfig(topk=6, beam_width=4, node_budget=60)
    choices = {}
    for name, curve in (("flat", FLAT), ("steep", STEEP)):
        auto = AutoBudget(curve, start=8, max_budget=40)
        for _ in range(3):
            auto.remember(context, search(rows_tokens, rows_probs, context, cfg).candidates, [], 0.002)
            auto.budget_for(context + target)
        choice = choices[name] = auto.best()
        # the choice is the best rate over every budget, by brute force on the same numbers; budget 0 is plain
        # decoding (one token per one-token forward, no drafting), taken only when it wins by PLAIN_MARGIN
        rates = {b: (1 + auto.accepted[b] / 3) / (0.002 + curve.time(1 + auto.nodes[b] / 3)) for b in range(1, 41)}
        rates[0] = 1 / curve.time(1) / PLAIN_MARGIN
        assert choice.budget == max(rates, key=rates.get)
        assert choice.expected_tokens_per_s == pytest.approx(rates[choice.budget] * (PLAIN_MARGIN if
                                                                                     choice.budget == 0 else 1))
        assert choice.expected_tokens_per_s >= choice.start_tokens_per_s
    assert choices["flat"].expected_tokens == pytest.approx(5.0)      # free nodes: the whole chain is caught
    assert choices["flat"].budget >= 4
    assert choices["steep"].budget < choices["flat"].budget           # costly nodes: a smaller tree, or none


def test_decoding_with_an_automatic_budget_is_lossless_and_records_its_choice():
    target = tiny_target("llama", seed=7)
    prompts = [[1, 5, 6, 7, 8, 5, 6, 7], [1, 30, 31, 32, 33]]
    for drafter in (OracleDrafter(target, n_rows=3), HeadDrafter(random_head(target, n_mask=2, seed=2), target)):
        for lookup in (None, PromptLookupProposer(num_tokens=4)):
            dart = DartProposer(drafter, SearchConfig(topk=5, beam_width=3, node_budget=6), lookup=lookup,
                                auto_budget=AutoBudget(STEEP, start=6, max_budget=20))
            for p in prompts:
                trace = run(target, dart, p, GenerationConfig(max_new_tokens=24))
                assert trace.output_ids == plain_greedy_reference(target, p, 24)
                budgets = [s.budget for s in trace.steps[1:]]
                assert all(b["auto"] and b["nodes"] <= 20 for b in budgets)
                assert all(len(s.tree) - 1 <= s.budget["nodes"] + len(s.lookup_nodes) for s in trace.steps[1:])
                used = Metrics.from_steps(trace.steps).node_budgets      # what the bench and --json report
                assert sum(used.values()) == len(trace.steps) - 1
                assert used == {str(n): [b["nodes"] for b in budgets].count(n) for n in {b["nodes"] for b in budgets}}
            assert dart.auto_budget.steps > 0 and dart.auto_budget.choice is not None
    # with the oracle's perfect chains and nodes that cost little, the choice leaves the starting budget for the
    # oracle's 3-token chains
    cheap = CostCurve((1, 4, 64), (0.01, 0.011, 0.5))
    oracle = DartProposer(OracleDrafter(target, n_rows=3), SearchConfig(topk=5, beam_width=3, node_budget=6),
                          auto_budget=AutoBudget(cheap, start=6, max_budget=20))
    trace = run(target, oracle, prompts[0], GenerationConfig(max_new_tokens=24))
    assert trace.steps[-1].budget["nodes"] == 3 and trace.steps[-1].budget["choice"]["expected_tokens"] > 3.5


def test_where_drafting_does_not_pay_dart_decodes_plainly_and_keeps_probing():
    target = tiny_target("llama", seed=8)
    prompt = [1, 30, 31, 32, 33]
    costly = CostCurve((1, 2, 64), (0.01, 0.05, 2.0))   # any draft node costs four steps
    dart = DartProposer(HeadDrafter(random_head(target, n_mask=3, seed=4), target),
                        SearchConfig(topk=5, beam_width=3, node_budget=6), lookup=PromptLookupProposer(num_tokens=3),
                        auto_budget=AutoBudget(costly, start=6, max_budget=20))
    trace = run(target, dart, prompt, GenerationConfig(max_new_tokens=60))
    assert trace.output_ids == plain_greedy_reference(target, prompt, 60)
    nodes = [s.budget["nodes"] for s in trace.steps[1:]]
    plain = [i for i, n in enumerate(nodes) if n == 0]
    assert len(plain) > len(nodes) // 2                                   # mostly plain decoding
    assert all(len(trace.steps[1 + i].tree) == 1 and trace.steps[1 + i].candidates is None for i in plain)
    probes = [n for n in nodes[plain[0]:] if n > 0]
    assert probes and len(probes) <= len(nodes[plain[0]:]) // 8 + 1      # one drafted step in PROBE_EVERY
    choice = trace.steps[-1].budget["choice"]
    assert choice["budget"] == 0 and choice["best_drafting"] > 0
    assert choice["start_tokens_per_s"] < choice["plain_tokens_per_s"] == choice["expected_tokens_per_s"]
