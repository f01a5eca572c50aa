"""The automatic node budget: its per-budget acceptance is exactly what the search would have built and the target
accepted, it trades tokens for the machine's verify cost, and decoding with it stays lossless."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from dart_core.budget import auto as auto_budget
from dart_core.budget.branch_alone import ALONE_NGRAM, BranchAlone
from dart_core.budget.step_budget import BudgetChoice
from dart_core.budget.auto import (CHECK_STEPS, MIN_VERIFIES, PLAIN_MARGIN, PROBE_EVERY, PROBE_EVERY_MAX,
                                   RECENT_VERIFIES, REMEASURE_SHARE, AutoBudget)
from dart_core.decoding import GenerationConfig, run
from dart_core.forensics.misses import lookup_effects
from dart_core.metrics import Metrics
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer, HeadDrafter, PromptLookupProposer
from dart_core.methods import DART_PLD
from dart_core.machine.records import CostCurve, MachineRecord
from dart_core.setup.calibration import measure_cost_curve, measuring_seconds, monotone_fit
from dart_core.setup.defaults import LOOKUP_LONGEST, LOOKUP_TOKENS
from dart_core.setup import calibration, loading
from dart_core.setup.loading import DraftSettings, Loaded
from dart_core.trace import RunSettings
from dart_core.views.figures import cost_figure
from dart_core.tree_search import SearchConfig, search
from tests.lean_pairs import STEPS, lean_pair
from dart_core.setup.tiny_models import OracleDrafter, plain_greedy_reference, random_head, tiny_target

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
        assert auto.accepted[0, b] == len(path) - 1, b
        assert auto.nodes[0, b] == len(tree) - 1, b


@pytest.mark.parametrize("seed", range(4))
def test_acceptance_per_branch_length_is_what_the_shorter_branch_would_have_given(seed):
    rng = np.random.default_rng(seed)
    rows_tokens, rows_probs = random_rows(rng)
    context = [3, 7, 11]
    cfg = SearchConfig(topk=6, beam_width=4, node_budget=60)
    pool = search(rows_tokens, rows_probs, context, cfg).candidates
    target = [int(t) for t in rows_tokens[:, 0]] + [int(t) for t in rng.integers(0, 40, 4)]
    agree = int(rng.integers(0, 7))             # the branch follows the target this far, then leaves it
    branch = target[:agree] + [39, 38, 37][: 7 - agree]
    auto = AutoBudget(FLAT, start=4, max_budget=20)
    auto.choose_lookup(range(8), start=5)
    assert auto.lookup_tokens == 5 and list(auto.lengths) == list(range(8))
    auto.remember(context, pool, branch, 0.001)
    auto.budget_for(context + target)
    assert auto.steps == 1
    for n in range(8):
        for b in range(0, 21, 4):
            tree = search(rows_tokens, rows_probs, context, SearchConfig(topk=6, beam_width=4, node_budget=b)).tree
            tree, _ = tree.with_branch(branch[:n], n)
            path, _ = tree.follow(target)
            assert auto.accepted[n, b] == len(path) - 1, (n, b)
            assert auto.nodes[n, b] == len(tree) - 1, (n, b)


def test_the_branch_length_is_chosen_with_the_budget():
    rng = np.random.default_rng(3)
    rows_tokens, rows_probs = random_rows(rng)
    context = [1, 2]
    cfg = SearchConfig(topk=6, beam_width=4, node_budget=60)
    target = [int(t) for t in rng.integers(0, 40, 8)]                 # the head's rows never hold it
    for branch, cheap_best in ((target[:6], 6), ([39, 38, 37, 36, 35, 34], 0)):
        auto = AutoBudget(STEEP, start=4, max_budget=10)
        auto.choose_lookup(range(7), start=3)
        for _ in range(3):
            auto.remember(context, search(rows_tokens, rows_probs, context, cfg).candidates, branch, 0.0)
            auto.budget_for(context + target)
        choice = auto.best()
        assert choice.lookup_tokens == cheap_best                       # all of a right branch, none of a wrong one
        rates = {(n, b): auto.rate(b, n)[1] for n in range(7) for b in range(1, 11)}
        assert choice.expected_tokens_per_s == pytest.approx(max(rates.values())) or choice.budget == 0


def test_where_no_drafted_tree_pays_the_lookup_branch_alone_is_kept_at_the_length_that_pays():
    rng = np.random.default_rng(3)
    rows_tokens, rows_probs = random_rows(rng)
    context, target = [1, 2, 3, 1, 2], [3, 1, 2, 3, 1, 2, 3, 1]
    cfg = SearchConfig(topk=6, beam_width=4, node_budget=60)
    cheap_rows = CostCurve((1, 2, 8, 64), (0.01, 0.012, 0.02, 1.0))
    right, wrong = target[:6], [39, 38, 37, 36, 35, 34]
    # a right branch after an n-gram of ALONE_NGRAM tokens is kept; after a shorter one, or a wrong one, plain decoding
    for branch, ngram, kept in ((right, ALONE_NGRAM, True), (right, ALONE_NGRAM - 1, False), (wrong, 3, False)):
        auto = AutoBudget(cheap_rows, start=4, max_budget=10)
        auto.choose_lookup(range(7), start=3)
        for _ in range(3):
            auto.remember(context, search(rows_tokens, rows_probs, context, cfg).candidates, branch, 1.0)
            auto.remember_alone(context, ngram, branch)   # drafting took a second: no drafted tree pays
            auto.budget_for(context + target)
        choice = auto.best()
        # by brute force: the branch alone at length L takes min(L, 6) tokens of a right branch for t(1 + L)
        rates = {n: (1 + (min(n, 6) if kept else 0)) / cheap_rows.time(1 + (n if kept else 0)) for n in range(7)}
        best = max(rates, key=rates.get)
        assert choice.budget == 0 and choice.alone_tokens == best and (best > 0) == kept
        assert choice.expected_tokens_per_s == pytest.approx(rates[best])
        assert choice.plain_tokens_per_s == pytest.approx(rates[0])
        assert BudgetChoice.from_dict(choice.to_dict()).alone_tokens == choice.alone_tokens   # as traces keep it


def test_the_branch_alone_counts_a_step_once_the_target_has_said_as_much_as_its_branch():
    alone = BranchAlone(range(4))
    alone.remember([1, 2, 3], ALONE_NGRAM, [7, 8, 9, 6, 6])              # kept up to the longest length, 3
    alone.settle([1, 2, 3, 7, 8])
    assert alone.steps == 0 and alone.pending == [(2, [7, 8, 9])]       # the target said 2 tokens of 3: waits
    alone.settle([1, 2, 3, 7, 8, 5])                                     # 7 and 8 right, then not 9
    assert alone.steps == 1 and not alone.pending and alone.accepted.tolist() == [0, 1, 2, 2]
    assert alone.nodes.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    alone.remember([1, 2, 3, 7, 8, 5], ALONE_NGRAM - 1, [4])            # after a shorter n-gram: plain at every length
    alone.settle([1, 2, 3, 7, 8, 5, 4])
    assert alone.steps == 2 and alone.accepted.tolist() == [0, 1, 2, 2] and alone.nodes[:, 0].tolist() == [2, 1, 1, 1]
    alone.remember([1, 2], ALONE_NGRAM, [3])
    alone.reset()                                                        # a new prompt: nothing pending
    assert not alone.pending


def settled_on_right_chains(curve: CostCurve) -> AutoBudget:
    """An automatic budget on `curve` that has settled three steps whose draft's argmax chain the target took
    (drafting 2 ms a step)."""
    rng = np.random.default_rng(1)
    rows_tokens, rows_probs = random_rows(rng)
    target = [int(t) for t in rows_tokens[:, 0]]
    context = [1, 2]
    cfg = SearchConfig(topk=6, beam_width=4, node_budget=60)
    auto = AutoBudget(curve, start=8, max_budget=40)
    for _ in range(3):
        auto.remember(context, search(rows_tokens, rows_probs, context, cfg).candidates, [], 0.002)
        auto.budget_for(context + target)
    return auto


def test_the_choice_follows_the_cost_curve():
    choices = {}
    for name, curve in (("flat", FLAT), ("steep", STEEP)):
        auto = settled_on_right_chains(curve)
        choice = choices[name] = auto.best()
        # the choice is the best rate over every budget, by brute force on the same numbers; budget 0 is plain
        # decoding (one token per one-token forward, no drafting), taken only when it wins by PLAIN_MARGIN
        rates = {b: (1 + auto.accepted[0, b] / 3) / (0.002 + curve.time(1 + auto.nodes[0, b] / 3))
                 for b in range(1, 41)}
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
                assert all(b.auto and b.nodes <= 20 for b in budgets)
                assert all(len(s.tree) - 1 <= s.budget.nodes + len(s.lookup_nodes) for s in trace.steps[1:])
                used = Metrics.from_steps(trace.steps).node_budgets      # what the bench and --json report
                assert sum(used.values()) == len(trace.steps) - 1
                assert used == {str(n): [b.nodes for b in budgets].count(n) for n in {b.nodes for b in budgets}}
            # (a correction of the curve after the last verify clears the choice in force, not the one made)
            assert dart.auto_budget.steps > 0 and dart.auto_budget.choice_record is not None
    # with the oracle's perfect chains and nodes that cost little, the choice leaves the starting budget for the
    # oracle's 3-token chains
    cheap = CostCurve((1, 4, 64), (1.0, 1.1, 50.0))   # seconds: the drafting time measured here is negligible
    oracle = DartProposer(OracleDrafter(target, n_rows=3), SearchConfig(topk=5, beam_width=3, node_budget=6),
                          auto_budget=AutoBudget(cheap, start=6, max_budget=20))
    trace = run(target, oracle, prompts[0], GenerationConfig(max_new_tokens=24))
    assert trace.steps[-1].budget.nodes == 3 and trace.steps[-1].budget.choice.expected_tokens > 3.5


def test_where_drafting_does_not_pay_dart_decodes_plainly_and_keeps_probing(monkeypatch):
    monkeypatch.setattr(auto_budget, "CHECK_STEPS", 10**6)   # the curve is not corrected mid-run: choices on schedule
    target = tiny_target("llama", seed=8)
    prompt = [1, 30, 31, 32, 33]
    costly = CostCurve((1, 2, 64), (0.01, 0.05, 2.0))   # any draft node costs four steps
    dart = DartProposer(HeadDrafter(random_head(target, n_mask=3, seed=4), target),
                        SearchConfig(topk=5, beam_width=3, node_budget=6), lookup=PromptLookupProposer(num_tokens=3),
                        auto_budget=AutoBudget(costly, start=6, max_budget=20))
    trace = run(target, dart, prompt, GenerationConfig(max_new_tokens=200))
    assert trace.output_ids == plain_greedy_reference(target, prompt, 200)
    nodes = [s.budget.nodes for s in trace.steps[1:]]
    plain = [i for i, n in enumerate(nodes) if n == 0]
    assert len(plain) > len(nodes) // 2                                   # mostly plain decoding
    assert all(len(trace.steps[1 + i].tree) == 1 and trace.steps[1 + i].candidates is None for i in plain)
    # while plain decoding keeps winning, the probes (drafted steps under a plain choice) come ever further apart
    probes = [i for i, s in enumerate(trace.steps[1:]) if s.budget.choice and s.budget.choice.budget == 0
              and s.budget.nodes > 0]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(probes) >= 6 and gaps == [min(PROBE_EVERY * 2**i, PROBE_EVERY_MAX) for i in range(len(gaps))]
    assert [i for i, n in enumerate(nodes) if n > 0 and i > plain[0]] == [i for i in probes if i > plain[0]]
    choice = trace.steps[-1].budget.choice
    assert choice.budget == 0 and choice.best_drafting > 0
    assert choice.start_tokens_per_s < choice.plain_tokens_per_s == choice.expected_tokens_per_s


@pytest.mark.parametrize("graphs", STEPS)   # the C layer, torch operations, the fixed shapes a GPU captures
def test_where_drafting_does_not_pay_dart_pld_keeps_the_lookup_branch_alone_and_stays_lossless(graphs, monkeypatch):
    monkeypatch.setattr(auto_budget, "CHECK_STEPS", 10**6)   # the curve is not corrected mid-run: choices on schedule
    _, target = lean_pair("llama", seed=7, graphs=graphs)
    prompt = [1, 5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]
    dear_drafts = CostCurve((1, 2, 8, 64), (0.01, 0.012, 0.02, 1.0))
    monkeypatch.setattr(loading, "cost_curve", lambda *a, **k: dear_drafts)
    loaded = Loaded(target, random_head(target, n_mask=2, seed=2), draft_kernels="fp32")
    dart = loaded.proposer(DART_PLD, DraftSettings(SearchConfig(topk=5, beam_width=3, node_budget=6), auto_budget=True))
    monkeypatch.setattr(dart.auto_budget, "remember", lambda context, pool, branch, seconds: AutoBudget.remember(
        dart.auto_budget, context, pool, branch, 1.0))      # a drafting step takes a second: no drafted tree pays
    trace = run(target, dart, prompt, GenerationConfig(max_new_tokens=60))
    assert trace.output_ids == plain_greedy_reference(target, prompt, 60)
    alone = [s for s in trace.steps[1:] if s.budget.nodes == 0 and len(s.tree) > 1]
    assert alone and all(s.candidates is None and s.rows_tokens is None for s in alone)      # nothing drafted
    for s in alone:   # the tree is the root and the branch's first choice.alone_tokens tokens, nothing else
        ngram, branch = dart.lookup.index.matched(trace.context_at(s.index))
        assert ngram >= ALONE_NGRAM and s.tree.tokens[1:] == branch[:s.budget.choice.alone_tokens]
        assert s.lookup_nodes == list(range(1, len(s.tree))) and s.budget.lookup == len(s.tree) - 1
        assert "branch alone" in s.budget.text()
    assert sum(s.accepted for s in alone) > 0


def test_dart_pld_chooses_its_branch_length_as_it_goes_and_stays_lossless(monkeypatch):
    target = tiny_target("llama", seed=7)
    prompt = [1, 5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]
    cheap = CostCurve((1, 4, 64), (1.0, 1.1, 50.0))
    monkeypatch.setattr(loading, "cost_curve", lambda *a, **k: cheap)   # this machine's curve is not measured
    loaded = Loaded(target, random_head(target, n_mask=2, seed=2), draft_kernels="fp32")
    dart = loaded.proposer(DART_PLD, DraftSettings(SearchConfig(topk=5, beam_width=3, node_budget=6), auto_budget=True))
    auto = dart.auto_budget
    assert dart.lookup.num_tokens == LOOKUP_LONGEST and auto.chooses_lookup
    assert list(auto.lengths) == list(range(LOOKUP_LONGEST + 1)) and auto.lookup_tokens == LOOKUP_TOKENS
    trace = run(target, dart, prompt, GenerationConfig(max_new_tokens=40),
                settings=RunSettings(search=dart.search_config, lookup_tokens=LOOKUP_LONGEST, auto_budget=True))
    assert trace.output_ids == plain_greedy_reference(target, prompt, 40)
    steps = [s for s in trace.steps[1:] if s.candidates is not None]
    assert all(0 <= s.budget.lookup <= LOOKUP_LONGEST for s in steps)
    for s in steps:   # each tree grafted the branch's first budget["lookup"] tokens, no more
        branch = dart.lookup.lookup(trace.context_at(s.index))[:s.budget.lookup]
        assert all(s.tree.tokens[n] in branch for n in s.lookup_nodes)
    last = trace.steps[-1].budget.choice
    assert last.lookup_tokens == auto.lookup_tokens and last.lookup_tokens > 0   # the branch pays here
    # the forensics read each step's own branch back: a fixed branch's effect is against the run's own acceptance
    effects = {e.value: e for e in lookup_effects(trace, max_ngram=3, lengths=(0, LOOKUP_LONGEST))}
    for n in (0, LOOKUP_LONGEST):
        again = 0
        for s in steps:
            tree = search(s.rows_tokens, s.rows_probs, trace.context_at(s.index),
                          replace(dart.search_config, node_budget=s.budget.nodes)).tree
            tree, _ = tree.with_branch(dart.lookup.lookup(trace.context_at(s.index))[:n], n)
            again += len(tree.follow(trace.output_ids[sum(len(x.new_tokens) for x in trace.steps[:s.index]):])[0]) - 1
        assert effects[n].extra_tokens == again - sum(s.accepted for s in steps), n


def test_the_measured_curve_is_a_median_fitted_never_to_decrease(one_thread):
    noisy = (0.075, 0.080, 0.104, 0.085, 0.090)          # t(12) above t(16): seen on a 2-core EPYC
    fit = monotone_fit(noisy)
    assert all(a <= b for a, b in zip(fit, fit[1:])) and fit[:2] == noisy[:2]
    assert monotone_fit((1.0, 2.0, 3.0)) == (1.0, 2.0, 3.0)            # a curve that is already monotone stays
    curve = measure_cost_curve(tiny_target("llama", seed=8), rows=(1, 2, 4, 8), context=16, rounds=3)
    assert len(curve.measured) == 4 and curve.seconds == monotone_fit(curve.measured)
    assert CostCurve.from_dict(curve.to_dict()) == CostCurve(curve.rows, tuple(round(s, 6) for s in curve.seconds),
                                                             curve.context, tuple(round(m, 6) for m in curve.measured))
    assert CostCurve.from_dict({"rows": [1, 2], "seconds": [1.0, 2.0], "context": 8}).measured is None   # old files


def test_each_size_is_timed_after_a_verify_of_its_own_size(one_thread, monkeypatch):
    """A verify right after a larger one can cost more (one row after 64: 3.1-3.2 ms, after one row 2.5-2.7, EPYC
    Zen 5): the curve times each size as a run of steps of that size meets it."""
    target = tiny_target("llama", seed=8)
    sizes, verify = [], target.verify

    def slow_after_another_size(tree, *args, **kwargs):
        if sizes and sizes[-1] != len(tree):
            time.sleep(0.02)                  # the cost of following another size
        sizes.append(len(tree))
        return verify(tree, *args, **kwargs)
    monkeypatch.setattr(target, "verify", slow_after_another_size)
    curve = measure_cost_curve(target, rows=(1, 2, 4), context=16, rounds=2)
    assert sizes == [1, 1, 2, 2, 4, 4] * 3                 # a warm-up pass, then 2 timed
    assert max(curve.measured) < 0.02                     # none timed right after another size


def test_a_choice_that_ends_at_a_size_times_no_larger_one(one_thread, monkeypatch):
    """Where a kernel's choice ends at the first size at which it is slower, the sizes are timed one after another,
    each one's passes alternating the ways, and none past the first size that ends the choice."""
    target = tiny_target("llama", seed=8)
    sizes, verify = [], target.verify
    monkeypatch.setattr(target, "verify", lambda tree, *a, **k: sizes.append(len(tree)) or verify(tree, *a, **k))
    ways, asked = [], []
    _, medians = calibration._verify_times(target, (1, 2, 4, 8), 16, 2, {"a": lambda: ways.append("a"),
                                                                        "b": lambda: ways.append("b")},
                                           last=lambda t: asked.append(t) or len(asked) == 2)
    assert sizes == [1] * 12 + [2] * 12                    # 3 passes (a warm-up, 2 timed) of 2 ways, twice a way
    assert ways == ["a", "b"] * 6 and [sorted(t) for t in asked] == [["a", "b"]] * 2
    assert {way: len(ts) for way, ts in medians.items()} == {"a": 2, "b": 2} and all(t > 0 for t in medians["a"])
    sizes.clear()
    calibration._verify_times(target, (1, 2), 16, 1, {"a": lambda: None}, last=lambda t: False)
    assert sizes == [1] * 4 + [2] * 4                      # never ended: every size


def test_the_curve_measures_both_sides_of_every_row_count_where_a_kernel_may_switch():
    """A kernel chosen up to r rows serves r and not r + 1: the curve measures both, so no straight line of it bridges
    the switch (9 rows took 12.6 ms where a line from 8 to 12 said 7.9, EPYC Zen 5)."""
    from dart_core.setup.calibration import CURVE_ROWS, GREEDY_COPY_ROWS, Q4_1_ROWS, READING_ROWS
    switches = {r for r in GREEDY_COPY_ROWS + Q4_1_ROWS + READING_ROWS if r < CURVE_ROWS[-1]}
    assert all(r in CURVE_ROWS and r + 1 in CURVE_ROWS for r in switches)


def test_the_monotone_fit_is_the_least_squares_isotonic_regression():
    from scipy.optimize import isotonic_regression     # the reference (a test dependency; the engine has its own)
    rng = np.random.default_rng(0)
    for _ in range(200):
        seconds = rng.random(int(rng.integers(1, 16)))
        assert np.allclose(monotone_fit(seconds), isotonic_regression(seconds).x)


def test_each_choice_weighs_the_curve_as_the_runs_verifies_measure_it():
    auto = AutoBudget(CostCurve((1, 2, 4, 64), (1.0, 1.5, 2.0, 20.0)), start=8)
    assert auto.run_curve() is auto.curve                                 # nothing measured yet
    for seconds in (9.0, 9.0, 9.0):                                       # to be pushed out of the latest verifies
        auto.observe_verify(1, seconds)
    for seconds in (0.5, 0.4, 0.6) + (0.5,) * (RECENT_VERIFIES - 3 - MIN_VERIFIES - 1):
        auto.observe_verify(1, seconds)
    for _ in range(MIN_VERIFIES):
        auto.observe_verify(4, 1.5)
    auto.observe_verify(16, 100.0)                                        # too few times to count
    curve = auto.run_curve()
    assert curve.time(1) == pytest.approx(0.5) and curve.time(4) == pytest.approx(1.5)   # the medians
    assert curve.time(64) == pytest.approx(20.0 * 0.75)                   # beyond: the nearest size's ratio
    assert curve.time(2) == pytest.approx(1.5 * (0.5 + 0.25 / 3))      # between: the ratio interpolated
    assert auto.best().plain_tokens_per_s == pytest.approx(2.0) and auto.best().curve.time(4) == pytest.approx(1.5)
    for _ in range(RECENT_VERIFIES):                                      # the run stops verifying one row: its
        auto.observe_verify(4, 1.0)                                       # times leave, the neighbour's ratio stays
    assert auto.run_curve().time(1) == pytest.approx(0.5 * 1.0) and auto.run_curve().time(4) == pytest.approx(1.0)


def test_a_tree_the_curve_calls_dear_is_chosen_where_the_runs_verifies_find_it_cheap():
    choices = {}
    for measured in (False, True):
        auto = settled_on_right_chains(STEEP)
        for size in (1, 64) if measured else ():                        # verifies of 64 cost about one of 1 here
            for _ in range(MIN_VERIFIES):
                auto.observe_verify(size, 0.01 if size == 1 else 0.011)
        choices[measured] = auto.best()
    assert choices[True].budget > max(choices[False].budget, 4) and choices[True].expected_tokens > 4


def test_a_curve_the_run_disagrees_with_is_measured_again_then_scaled():
    calls = []

    def remeasure():
        calls.append(1)
        return CostCurve((1, 64), (0.02, 0.02))        # still half of what the run measures
    auto = AutoBudget(CostCurve((1, 64), (0.01, 0.01)), start=8, remeasure=remeasure)
    events = [auto.observe_verify(4, 0.012) for _ in range(CHECK_STEPS)]   # 1.2x: within the tolerance
    assert events == [None] * CHECK_STEPS and not calls
    events = [auto.observe_verify(4, 0.04) for _ in range(CHECK_STEPS)]    # 4x slower than the curve says
    assert events[:-1] == [None] * (CHECK_STEPS - 1) and calls == [1]
    assert events[-1].action == "re-measured" and events[-1].ratio == pytest.approx(4.0)
    assert auto.curve.seconds == (0.02, 0.02)
    last = [auto.observe_verify(4, 0.04) for _ in range(CHECK_STEPS)][-1]   # still 2x: measured once, then scaled
    assert calls == [1] and last.action == "scaled" and auto.curve.time(4) == pytest.approx(0.04)
    assert [auto.observe_verify(4, 0.04) for _ in range(CHECK_STEPS)] == [None] * CHECK_STEPS   # agrees now


def test_the_curve_is_measured_again_only_where_that_costs_a_small_share_of_the_run():
    calls = []

    def remeasure():
        calls.append(1)
        return CostCurve((1, 64), (0.04, 0.04))
    # measuring costs 1 s on the machine the curve describes, 4 s on one 4x slower, 16 s on one 16x slower: at most
    # REMEASURE_SHARE of the run's verify time
    auto = AutoBudget(CostCurve((1, 64), (0.01, 0.01)), start=8, remeasure=remeasure,
                      remeasure_cost=lambda curve: 50 * sum(curve.seconds))
    early = [auto.observe_verify(4, 0.04) for _ in range(CHECK_STEPS)][-1]   # 4x after 0.32 s of verifies
    assert early.action == "scaled" and not calls and auto.curve.time(4) == pytest.approx(0.04)
    settled = 16.0 / REMEASURE_SHARE / 0.04                                  # verifies that make 16 s a small share
    assert all(auto.observe_verify(4, 0.04) is None for _ in range(int(settled)))
    late = [auto.observe_verify(4, 0.16) for _ in range(CHECK_STEPS)][-1]    # 4x again, after 320 s of verifies
    assert late.action == "re-measured" and calls == [1] and auto.curve.time(4) == pytest.approx(0.04)


def test_measuring_the_curve_costs_two_verifies_of_each_size_a_pass():
    curve = CostCurve((1, 2, 4), (0.01, 0.02, 0.03))
    assert measuring_seconds(curve, rounds=3) == pytest.approx(2 * 4 * 0.06)


def test_decoding_corrects_a_wrong_curve_and_stays_lossless():
    target = tiny_target("llama", seed=9)
    prompt = [1, 5, 9, 13, 17]
    wrong = CostCurve((1, 64), (100.0, 100.0))                                # ten thousand times too slow
    auto = AutoBudget(wrong, start=6, max_budget=20, remeasure=lambda: wrong)  # measured again: as wrong
    dart = DartProposer(OracleDrafter(target, n_rows=3), SearchConfig(node_budget=6), auto_budget=auto)
    trace = run(target, dart, prompt, GenerationConfig(max_new_tokens=128))
    assert trace.output_ids == plain_greedy_reference(target, prompt, 128)
    fixes = [s.budget.curve for s in trace.steps[1:] if s.budget.curve is not None]
    assert [f.action for f in fixes][:2] == ["re-measured", "scaled"] and fixes[0].ratio < 0.01
    assert auto.curve.time(1) < 1.0                                            # scaled to what the run measured
    trace.settings.machine = MachineRecord(summary="a CPU", cost_curve=wrong)
    fig = cost_figure(trace)                                                   # the chart draws the corrected one
    assert "scaled: the run measured" in fig.data[0].name
    assert fig.data[0].y[0] == pytest.approx(1.0) and fig.data[0].y[-1] == pytest.approx(1.0)
    fixed = next(s for s in trace.steps[1:] if s.budget.curve is not None)
    assert "the cost curve was re-measured: verifies took" in fixed.budget.text()


def test_on_a_gpu_the_budget_may_grow_to_the_largest_fixed_shape_bucket(monkeypatch):
    from dart_core.budget.auto import GPU_MAX_BUDGET, MAX_BUDGET, max_budget_for
    from dart_core.fixed_step import FIXED_BUCKETS
    from dart_core.setup.calibration import curve_rows
    assert GPU_MAX_BUDGET + 1 == FIXED_BUCKETS[-1] == curve_rows("cuda")[-1]     # a tree and its root: one bucket
    assert max_budget_for("cpu") == MAX_BUDGET and curve_rows("cpu")[-1] == 64
    target = tiny_target("llama", seed=2)
    monkeypatch.setattr(loading, "cost_curve", lambda *a, **k: FLAT)
    monkeypatch.setattr(loading, "max_budget_for", lambda device_type: GPU_MAX_BUDGET)   # as on a GPU
    auto = loading.auto_budget(target, "tiny", DraftSettings(SearchConfig(node_budget=60), True))
    assert auto.max_budget == GPU_MAX_BUDGET and len(auto.budgets) == GPU_MAX_BUDGET + 1
