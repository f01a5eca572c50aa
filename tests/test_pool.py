"""What a step would have accepted: the expected rate and a pool's acceptance per budget and branch
(dart_core.budget.pool), a trace's steps with the target's continuation (dart_core.forensics.replay), a step's own
lookup branch; and the trace's derived candidate columns computed by the search's own terms."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest

from dart_core.budget.pool import CandidatePool, expected_rate, pool_path
from dart_core.machine import few_rows
from dart_core.machine.hardware import detect, kernels_here
from dart_core.budget.step_budget import StepBudget
from dart_core.forensics.replay import replay_step, replay_steps
from dart_core.machine.records import CostCurve
from dart_core.ngram import NGramModel
from dart_core.trace import StepRecord
from dart_core.tree import TokenTree
from dart_core.tree_search import SearchConfig, rescore, search
from tests.hand_misses import PROMPT, ROOT, two_steps

CURVE = CostCurve((1, 5), (0.01, 0.03))     # t(k) = 0.01 + 0.005 (k - 1), the same line beyond 5


def test_the_expected_rate_by_hand():
    # 2 tokens a step with 2 nodes: 5 ms of drafting plus t(3) = 20 ms
    assert expected_rate(2.0, 2, 0.005, CURVE) == pytest.approx(2.0 / 0.025)
    rates = expected_rate(np.array([1.0, 2.0, 3.0]), np.array([0.0, 2.0, 6.0]), 0.005, CURVE)
    # plain decoding: t(1) = 10 ms; beyond the measured sizes the last segment goes on: t(7) = 40 ms
    assert rates == pytest.approx([1.0 / 0.015, 2.0 / 0.025, 3.0 / 0.045])


def test_a_pool_accepts_by_hand():
    # step 1 of the hand-built trace (tests/test_miss_classes.py): the target's 21 32 have pool ranks 0 and 3
    pool = CandidatePool.of(two_steps().steps[1].candidates)
    assert list(pool.path_ranks([21, 32, 99])) == [0, 3]
    accepted, nodes = pool.accepted([], [21, 32], [1, 3, 4, 9])
    assert list(accepted) == [1, 1, 2, 2] and list(nodes) == [1, 3, 4, 9]
    by_length, nodes_by_length = pool.accepted_by_length([], [21, 32], [1, 3, 4, 9], [0, 2, 5])   # no branch
    assert by_length.tolist() == [[1, 1, 2, 2]] * 3 and nodes_by_length.tolist() == [[1, 3, 4, 9]] * 3
    # a branch 21 32 40: it agrees with the target for 2 tokens; of its 3 nodes the pool's top b holds those ranked
    # below b (21: 0, 21 32: 3; 40 is not in the pool)
    accepted, nodes = pool.accepted([21, 32, 40], [21, 32], [1, 3, 4, 9])
    assert list(accepted) == [2, 2, 2, 2] and list(nodes) == [3, 5, 5, 10]
    by_length, nodes_by_length = pool.accepted_by_length([21, 32, 40], [21, 32], [1, 4], [0, 1, 3])
    assert by_length.tolist() == [[1, 2], [1, 2], [2, 2]] and nodes_by_length.tolist() == [[1, 4], [1, 4], [3, 5]]


def test_a_candidates_rank_alone_is_its_rank_in_the_whole_pool():
    """The automatic budget ranks only the candidates it asks about: the same ranks as sorting the whole pool, ties
    in score broken by level, then by the pool's order."""
    gen = np.random.default_rng(0)
    n = 400
    pool = CandidatePool(np.arange(n), np.full(n, -1), gen.integers(0, 6, n).astype(np.float64) * -0.5,
                         gen.integers(0, 3, n).astype(np.int32))
    whole = np.empty(n, dtype=np.int64)
    whole[np.lexsort((pool.level, -pool.score))] = np.arange(n)
    assert (pool.ranks_of(np.arange(n)) == whole).all()
    assert list(pool.ranks_of([7, 3])) == [whole[7], whole[3]] and pool.ranks_of([]).size == 0


def test_a_paths_ranks_in_c_are_numpys(monkeypatch):
    """Where our kernels are built a path's ranks come from one C pass (tree_search.c: pool_path_ranks): the same as
    walking the pool and ranking in numpy (what a machine without them runs), ties in score included, for paths the
    pool holds whole, in part or not."""
    kernel = kernels_here()
    if kernel is None:   # no C compiler here: numpy's is all there is
        assert few_rows.why_not(detect().kind)
        return
    pool_module = sys.modules[CandidatePool.__module__]
    gen = np.random.default_rng(3)
    for trial in range(12):
        rows_probs = -np.sort(-gen.dirichlet(np.full(6, 0.7), size=4), axis=1)
        if trial % 2:
            rows_probs = np.round(rows_probs, 1)            # equal scores
        rows_tokens = np.stack([gen.permutation(9)[:6] for _ in range(4)]).astype(np.int64)
        pool = CandidatePool.of_search(search(rows_tokens, rows_probs, [1], SearchConfig(topk=6, beam_width=4,
                                                                                          node_budget=20), None))
        for _ in range(20):
            path = gen.integers(0, 9, gen.integers(0, 6)).tolist()
            walk = pool_path(pool.token, pool.parent, path)
            assert pool.path_ranks(path).tolist() == pool.ranks_of(walk).tolist()
            with monkeypatch.context() as without:        # the same pool where no kernels are built
                without.setattr(pool_module, "kernels_here", lambda: None)
                assert pool.path_ranks(path).tolist() == pool.ranks_of(walk).tolist()
        held = pool_path(pool.token, pool.parent, [int(t) for t in rows_tokens[:, 0]])
        assert len(held) == 4 and pool.path_ranks(rows_tokens[:, 0].tolist()).tolist() == pool.ranks_of(held).tolist()


def test_replay_steps_carry_the_context_and_what_the_target_said_next():
    trace = two_steps()                          # prefill ROOT, step 1 emits 21 32, step 2 emits 22 31
    steps = list(replay_steps(trace))
    assert [st.index for st in steps] == [1, 2]  # the prefill drafted nothing
    assert steps[0].context == PROMPT + [ROOT] and steps[0].future == [21, 32, 22, 31]
    assert steps[1].context == PROMPT + [ROOT, 21, 32] and steps[1].future == [22, 31]
    assert [st.future for st in replay_steps(trace, ahead=0)] == [[21, 32], [22, 31]]     # the rows' depth
    assert [st.future for st in replay_steps(trace, ahead=3)] == [[21, 32, 22], [22, 31]]
    assert replay_step(trace, 2) == steps[1] and replay_step(trace, 2).context == trace.context_at(2)
    # `whole`: only steps the run went on long enough after (a step cut short by the end of the run is left out)
    trace.steps[2].new_tokens = [22]
    assert [st.index for st in replay_steps(trace, ahead=0, whole=True)] == [1]


def test_a_steps_lookup_branch_is_read_back_or_cut_from_a_new_lookup():
    tree, nodes = TokenTree([20], [-1]).with_branch([21, 32, 40], 3)
    step = StepRecord(1, "verify", 7, [21, 32, 40, 5], 3, tree, lookup_nodes=nodes)
    assert step.lookup_branch() == [21, 32, 40]                                         # from the tree
    assert StepRecord(1, "verify", 7, [5]).lookup_branch() == []                           # none grafted
    looked_up = [21, 32, 40, 11, 12]
    assert step.lookup_branch(looked_up) == looked_up                                      # its length not chosen
    step.budget = StepBudget(4, True, lookup=2)
    assert step.lookup_branch(looked_up) == [21, 32] and step.budget.branch_used(looked_up) == [21, 32]


@pytest.mark.parametrize("ngram_weight", [0.0, 0.5, 1.0])
def test_the_derived_columns_are_the_searchs_own(ngram_weight):
    rng = np.random.default_rng(4)
    table = NGramModel.build([rng.integers(0, 30, 300).tolist()], vocab_size=30, order=3)
    rows = np.stack([rng.choice(30, size=6, replace=False) for _ in range(4)]).astype(np.int64)
    probs = -np.sort(-rng.dirichlet(np.ones(6), size=4), axis=1)
    cfg = SearchConfig(topk=6, beam_width=3, node_budget=10, ngram_weight=ngram_weight)
    for c in (search(rows, probs, [3, 7, 11], cfg, table).candidates,
              search(rows, probs, [3, 7, 11], replace(cfg, ngram_first_level=True), table).candidates):
        cols = {name: getattr(c, name) for name in ("level", "parent", "logit_term", "level_weight", "ngram_prob",
                                                    "ngram_match")}
        term, score = rescore(cols, ngram_weight, cfg.eps)
        assert np.array_equal(term, c.ngram_term) and np.array_equal(score, c.score)   # to the last bit
