import math
import random

import numpy as np
import pytest

from dart_core.budget.pool import CandidatePool
from dart_core.context_ngram import ContextNGram
from dart_core.machine import few_rows
from dart_core.machine.hardware import detect, kernels_here
from dart_core import tree_search_native
from dart_core.ngram import NGramModel
from dart_core.tree_search import (BEAM_CUT, EOS_END, EXPANDED, KEPT, LOW_NGRAM, NODE_BUDGET, SearchConfig,
                                   _tree_from_kept, search, search_in_numpy)


def random_rows(rng: np.random.Generator, n_rows: int, k: int, vocab: int):
    tokens = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(n_rows)])
    probs = rng.dirichlet(np.full(k, 0.3), size=n_rows)
    probs = -np.sort(-probs, axis=1)
    return tokens.astype(np.int64), probs


def naive_search(rows_tokens, rows_probs, context, cfg, ngram, eos):
    """A direct transcription of the reference's beam search (plain Python, one candidate at a time)."""
    beam = [((), 0.0)]
    pool = []
    for level in range(rows_tokens.shape[0]):
        nxt = []
        for seq, s in beam:
            ctx = (list(context) + list(seq))[-(ngram.order - 1):] if ngram else []
            for t, p in zip(rows_tokens[level][:cfg.topk], rows_probs[level][:cfg.topk]):
                term = min(cfg.logit_weight(level) * math.log(p + cfg.eps), 0.0)
                if ngram is not None and level > 0:
                    q, _ = ngram.prob(ctx, [int(t)])
                    term += min(cfg.ngram_weight * math.log(q[0] + cfg.eps), 0.0)
                child = (seq + (int(t),), s + cfg.level_weight(level) * term)
                nxt.append(child)
                pool.append(child)
        nxt = [c for c in nxt if c[0][-1] not in eos]
        nxt.sort(key=lambda c: -c[1])  # stable: equal scores keep parent-then-token order
        beam = nxt[:cfg.beam_width]
    pool.sort(key=lambda c: (-c[1], len(c[0])))
    return {c[0] for c in pool[:cfg.node_budget]}


def tree_sequences(tree):
    return {tuple(tree.tokens[i] for i in tree.path_to(n)[1:]) for n in range(1, len(tree))}


@pytest.mark.parametrize("cfg", [SearchConfig(), SearchConfig(topk=5, beam_width=3, node_budget=12),
                                 SearchConfig(topk=8, beam_width=1, node_budget=1),
                                 SearchConfig(topk=10, beam_width=6, node_budget=200, ngram_weight=1.0)])
def test_matches_naive_reference_and_is_prefix_closed(cfg):
    rng = np.random.default_rng(0)
    pyrng = random.Random(0)
    ngram = NGramModel.build([[pyrng.randrange(40) for _ in range(400)]], vocab_size=40, order=3)
    for trial in range(12):
        rows_tokens, rows_probs = random_rows(rng, 4, 25, 40)
        context = [pyrng.randrange(40) for _ in range(5)]
        table = ngram if trial % 2 else None
        result = search(rows_tokens, rows_probs, context, cfg, table, eos_ids={3})
        tree = result.tree
        seqs = tree_sequences(tree)
        # prefix closed: every kept sequence's prefix is kept too
        assert all(s[:-1] in seqs for s in seqs if len(s) > 1)
        assert len(tree) - 1 == min(cfg.node_budget, len(result.candidates))
        assert tree.tokens[0] == context[-1]
        expected = naive_search(rows_tokens, rows_probs, context, cfg, table, {3})
        assert seqs == expected


def test_score_parts_add_up():
    rng = np.random.default_rng(1)
    ngram = NGramModel.build([list(rng.integers(0, 30, 300))], vocab_size=30, order=3)
    rows_tokens, rows_probs = random_rows(rng, 3, 25, 30)
    cfg = SearchConfig(beam_width=4, node_budget=20)
    c = search(rows_tokens, rows_probs, [1, 2, 3], cfg, ngram).candidates
    parent_score = np.where(c.parent >= 0, c.score[np.maximum(c.parent, 0)], 0.0)
    assert np.allclose(c.score, parent_score + c.level_weight * (c.logit_term + c.ngram_term))
    assert np.allclose(c.level_weight, (c.level + 1.0) ** -0.7)
    assert np.allclose(c.logit_term, np.minimum(0.9 ** c.level * np.log(c.draft_prob + 1e-10), 0))
    # no n-gram term on the first level; on later levels it is present and matches the recorded probability
    assert (c.ngram_match[c.level == 0] == -1).all() and np.isnan(c.ngram_prob[c.level == 0]).all()
    later = c.level > 0
    assert np.allclose(c.ngram_term[later], np.minimum(0.5 * np.log(c.ngram_prob[later] + 1e-10), 0))
    assert (c.score <= 0).all()


def test_tie_keeps_parents():
    # One-hot rows and an n-gram that predicts them with probability 1: every term is 0 and all chain nodes
    # tie with the root's children. The reference's unstable sort could keep a child without its parent.
    chain = [5, 6, 7, 8]
    ngram = NGramModel.build([[4] + chain], vocab_size=20, order=3)
    rows_tokens = np.asarray([[t] + [t2 for t2 in range(10, 14)] for t in chain])
    rows_probs = np.asarray([[1.0, 0, 0, 0, 0]] * 4)
    for budget in range(1, 8):
        result = search(rows_tokens, rows_probs, [3, 4], SearchConfig(node_budget=budget, topk=5), ngram)
        seqs = tree_sequences(result.tree)
        assert all(s[:-1] in seqs for s in seqs if len(s) > 1)
        assert tuple(chain[: min(budget, 4)]) in seqs


def test_the_tree_is_built_from_kept_candidates_and_refuses_an_orphan():
    # candidates: 0 and 1 on level 0 (parent -1), 2 below 1, 3 below 2
    token, parent = np.asarray([10, 11, 12, 13]), np.asarray([-1, -1, 1, 2], dtype=np.int32)
    tree = _tree_from_kept(9, token, parent, np.asarray([1, 0, 2, 3]))
    assert tree.tokens == [9, 11, 10, 12, 13] and tree.parents == [-1, 0, 0, 1, 3]
    with pytest.raises(AssertionError, match="candidate 3 without its parent 2"):
        _tree_from_kept(9, token, parent, np.asarray([1, 3, 2]))   # 3 before its parent
    with pytest.raises(AssertionError, match="candidate 2 without its parent 1"):
        _tree_from_kept(9, token, parent, np.asarray([0, 2]))      # 2's parent never kept


def test_a_search_without_its_record_builds_the_same_tree_from_the_same_ranked_columns():
    rng = np.random.default_rng(4)
    ngram = NGramModel.build([rng.integers(0, 40, 500).tolist()], vocab_size=40, order=3)
    for trial in range(4):
        rows_tokens, rows_probs = random_rows(rng, 4, 10, 40)
        cfg = SearchConfig(topk=10, beam_width=5, node_budget=12)
        for fn in (search, search_in_numpy):
            recorded = fn(rows_tokens, rows_probs, [1, 2], cfg, ngram)
            bare = fn(rows_tokens, rows_probs, [1, 2], cfg, ngram, record=False)
            assert bare.candidates is None and bare.tree == recorded.tree
            assert np.array_equal(bare.kept, recorded.kept)
            pools = [CandidatePool.of_search(bare), CandidatePool.of(recorded.candidates)]
            for name in ("token", "parent", "score", "level"):
                a, b = (getattr(p, name) for p in pools)
                assert a.dtype == b.dtype and np.array_equal(a, b), (trial, name)
    assert search(rows_tokens, rows_probs, [1, 2], SearchConfig(node_budget=0), ngram, record=False).candidates is None


def test_fates_and_beam_states():
    rng = np.random.default_rng(2)
    rows_tokens, rows_probs = random_rows(rng, 3, 10, 50)
    rows_tokens[1, 0] = 3  # an EOS candidate on level 1
    cfg = SearchConfig(topk=10, beam_width=4, node_budget=15)
    c = search(rows_tokens, rows_probs, [1, 2], cfg, None, eos_ids={3}).candidates
    assert (c.fate == KEPT).sum() == 15
    assert set(c.fate) <= {KEPT, NODE_BUDGET}
    assert (c.node[c.fate == KEPT] > 0).all() and (c.node[c.fate != KEPT] == -1).all()
    for level in (0, 1):
        assert (c.beam[c.level == level] == EXPANDED).sum() == 4
    assert (c.beam[c.token == 3] == EOS_END).all()
    assert (c.beam[c.level == 2] == "last_level").all()
    assert (c.beam[(c.level == 0)] != EXPANDED).sum() == 6 and BEAM_CUT in set(c.beam)
    # only expanded candidates have children
    parents = set(c.parent[c.parent >= 0].tolist())
    assert all(c.beam[p] == EXPANDED for p in parents)


def test_low_ngram_fate():
    # Level-1 candidate 9 has a high draft probability but was never seen after the root: pruned for its n-gram.
    ngram = NGramModel.build([[1, 2, 4], [1, 2, 5]], vocab_size=12, order=3)
    rows_tokens = np.asarray([[2, 6, 7], [9, 4, 5]])
    rows_probs = np.asarray([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1]])
    result = search(rows_tokens, rows_probs, [0, 1], SearchConfig(topk=3, beam_width=1, node_budget=3), ngram)
    c = result.candidates
    seqs = tree_sequences(result.tree)
    assert (2, 4) in seqs and (2, 9) not in seqs
    nine = np.flatnonzero((c.token == 9) & (c.level == 1))[0]
    assert c.fate[nine] == LOW_NGRAM and c.ngram_match[nine] == 0


def test_budget_zero_and_room_limit():
    rows_tokens, rows_probs = random_rows(np.random.default_rng(3), 3, 5, 20)
    assert len(search(rows_tokens, rows_probs, [1], SearchConfig(node_budget=0)).tree) == 1
    assert len(search(rows_tokens, rows_probs, [1], SearchConfig(), node_budget=4).tree) == 5


@pytest.mark.parametrize("field,value", [("topk", 0), ("beam_width", 0), ("node_budget", -1),
                                         ("logit_decay", 0.0), ("ngram_weight", -1.0), ("eps", 0.0)])
def test_knobs_out_of_range(field, value):
    with pytest.raises(ValueError, match=field):
        SearchConfig(**{field: value}).validate()


@pytest.mark.parametrize("cfg", [SearchConfig(), SearchConfig(topk=5, beam_width=3, node_budget=12),
                                 SearchConfig(topk=8, beam_width=1, node_budget=1, ngram_first_level=True),
                                 SearchConfig(topk=10, beam_width=6, node_budget=200, ngram_weight=1.0),
                                 SearchConfig(topk=25, beam_width=20, node_budget=40, ngram_weight=0.0)])
def test_the_c_search_records_what_numpys_records_to_the_last_bit(cfg):
    """Where our kernels are built the search runs in C: every column of every candidate, the tree and the kept
    candidates exactly as the numpy search gives them, with ties (repeated probabilities, a table of few tokens) and
    EOS rows; a context-adaptive table takes numpy's search."""
    kernel = kernels_here()
    if kernel is None:   # no C compiler here: numpy's search is all there is
        assert few_rows.why_not(detect().kind)
        return
    rng = np.random.default_rng(7)
    pyrng = random.Random(7)
    ngram = NGramModel.build([[pyrng.randrange(12) for _ in range(300)]], vocab_size=12, order=3)
    for trial in range(16):
        rows_tokens, rows_probs = random_rows(rng, 5, 10, 12)
        if trial % 3 == 0:
            rows_probs = np.round(rows_probs, 1)              # equal scores
        context = [pyrng.randrange(12) for _ in range(trial % 4)] + [pyrng.randrange(12)]
        table = ngram if trial % 4 else None
        ours = search(rows_tokens, rows_probs.astype(np.float32), context, cfg, table, eos_ids={3, 4},
                      node_budget=30 if trial % 5 == 0 else None)
        theirs = search_in_numpy(rows_tokens, rows_probs.astype(np.float32), context, cfg, table, eos_ids={3, 4},
                                 node_budget=30 if trial % 5 == 0 else None)
        for name in ("token", "level", "parent", "draft_prob", "logit_term", "ngram_prob", "ngram_match",
                     "ngram_term", "level_weight", "score", "node"):
            a, b = getattr(ours.candidates, name), getattr(theirs.candidates, name)
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), (trial, name)
        assert list(ours.candidates.fate) == list(theirs.candidates.fate)
        assert list(ours.candidates.beam) == list(theirs.candidates.beam)
        assert np.array_equal(ours.kept, theirs.kept) and ours.tree == theirs.tree
    # certain drafts and no n-gram: a child scores exactly its parent, and the shallower must rank first
    certain = np.zeros((5, 10), dtype=np.float32)
    certain[:, 0] = 1.0
    ours, theirs = (fn(rows_tokens, certain, [1], cfg, None, node_budget=3) for fn in (search, search_in_numpy))
    assert np.array_equal(ours.candidates.score, theirs.candidates.score) and ours.tree == theirs.tree
    adaptive = ContextNGram(ngram)
    assert search(rows_tokens, rows_probs, [1, 2], cfg, adaptive).candidates.to_dict() == \
        search_in_numpy(rows_tokens, rows_probs, [1, 2], cfg, adaptive).candidates.to_dict()


def test_the_c_search_matches_numpy_where_a_context_is_followed_by_hundreds_of_tokens():
    """A skewed stream: after its common tokens the n-gram keys run to hundreds, where the C search's lookups walk a
    run forward from key to key (its searches probe outwards from the last one's place)."""
    kernel = kernels_here()
    if kernel is None:
        assert few_rows.why_not(detect().kind)
        return
    rng = np.random.default_rng(11)
    stream = np.minimum(rng.zipf(1.3, size=40000), 800) - 1
    ngram = NGramModel.build([stream.tolist()], vocab_size=800, order=3)
    common = np.argsort(-np.bincount(stream, minlength=800))
    cfg = SearchConfig(topk=25, beam_width=20, node_budget=60)
    for trial in range(6):
        # rows of common tokens (long runs after each other) mixed with rare ones, in no particular order
        rows = [np.concatenate([common[:15], rng.choice(common[15:], 10, replace=False)]) for _ in range(5)]
        rows_tokens = np.stack([rng.permutation(row) for row in rows]).astype(np.int64)
        rows_probs = -np.sort(-rng.dirichlet(np.full(25, 0.5), size=5), axis=1)
        context = [int(common[trial]), int(common[trial + 1])]
        ours = search(rows_tokens, rows_probs, context, cfg, ngram)
        theirs = search_in_numpy(rows_tokens, rows_probs, context, cfg, ngram)
        assert (ours.candidates.ngram_match > 0).sum() > 1000          # most lookups found their n-gram
        for name in ("ngram_prob", "ngram_match", "score", "node"):
            a, b = getattr(ours.candidates, name), getattr(theirs.candidates, name)
            assert np.array_equal(a, b, equal_nan=True), (trial, name)
        assert ours.tree == theirs.tree
        # a level's beams shared among threads, each thread with its own rows of last tokens: the same columns
        tail = context[-(ngram.order - 1):]
        one, *more = (tree_search_native.beam_search(kernel, rows_tokens, rows_probs, 25, tail, cfg, frozenset(),
                                                     ngram, 60, threads) for threads in (1, 2, 3))
        for table, kept in more:
            assert np.array_equal(kept, one[1]) and all(np.array_equal(table[c], one[0][c], equal_nan=True)
                                                        for c in table)
