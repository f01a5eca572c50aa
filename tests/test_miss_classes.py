"""Missed-token forensics on hand-built traces whose answers are known by construction (tests/hand_misses.py says
how): one step per class of miss (dart_core.forensics.misses.REASON_TEXT), a fully accepted step, a plain-decoding
step, the prompt-lookup flag, and what other node budgets, lookup branches and beam / n-gram knobs would have
recovered, computed by hand."""

from __future__ import annotations

from dataclasses import replace

from dart_core.acceptance import SamplingConfig
from dart_core.forensics.misses import BEAM, BEAM_KNOB, BEYOND, BUDGET, EOS_PARENT, IN_TREE, NGRAM, NGRAM_KNOB, \
    NOT_IN_TOPK, REASON_TEXT, budget_effects, lookup_effects, run_forensics, run_misses, search_effects, step_miss
from dart_core.ngram import NGramModel
from dart_core.trace import StepRecord, Trace
from dart_core.tree import TokenTree
from tests.hand_misses import CFG, EOS, PROBE, PROMPT, ROOT, accepted_at_budget, dart_step, new_trace, two_steps


# ------------------------------------------------------------------------------------------------- one per class
def test_node_budget_miss_names_the_budget_that_catches_it():
    trace = two_steps()
    m = step_miss(trace, 1)
    # 21 (rank 0) is accepted; 21 32 is in the pool at rank 3, one below the budget of 3.
    assert (m.step, m.depth, m.token, m.reason) == (1, 2, 32, BUDGET)
    assert (m.rank, m.row_rank, m.elsewhere, m.lookup) == (3, 1, False, False)
    assert m.text() == ("wanted “<32>” at depth 2: " + REASON_TEXT[BUDGET]
                        + " (pool rank 4: a node budget of 4 would have caught it); the head's guess no. 2 there")
    assert accepted_at_budget(trace, 1, m.rank + 1) == 2 and accepted_at_budget(trace, 1, m.rank) == 1


def test_a_miss_the_tree_held_under_another_parent():
    trace = two_steps()
    m = step_miss(trace, 2)
    # 22 (rank 2) is accepted; 22 31 is rank 5, but the tree holds 21 31 at the same depth.
    assert (m.depth, m.token, m.reason, m.rank, m.row_rank, m.elsewhere) == (2, 31, BUDGET, 5, 0, True)
    assert "a node budget of 6 would have caught it" in m.text()
    assert m.text().endswith("; the tree had it at that depth under another parent")
    assert accepted_at_budget(trace, 2, 6) == 2 and accepted_at_budget(trace, 2, 5) == 1


def test_low_ngram_miss():
    # The table has seen only 31 after "20 21": 21 32 takes the unseen penalty 0.5 ln(1e-10) = -11.5 and falls to
    # rank 7, though without it (-1.561) it beats the tree's worst node (23, -1.897) at a budget of 4.
    table = NGramModel.build([[20, 21, 31], [20, 22, 31], [20, 22, 32], [20, 22, 33]], vocab_size=96, order=3)
    cfg = replace(CFG, node_budget=4, ngram_weight=0.5)
    trace = dart_step(new_trace(cfg), [21, 32], ngram=table)
    m = step_miss(trace, 1)
    assert (m.depth, m.token, m.reason, m.rank, m.row_rank, m.elsewhere) == (2, 32, NGRAM, 7, 1, False)
    assert REASON_TEXT[NGRAM] in m.text() and "a node budget of 8 would have caught it" in m.text()
    assert accepted_at_budget(trace, 1, 8, table) == 2 and accepted_at_budget(trace, 1, 7, table) == 1
    # Replayed without the n-gram term the pool is the plain one: 21 32 is rank 3, inside the budget of 4.
    effects = {e.value: e.extra_tokens for e in search_effects(trace, table, knobs=(NGRAM_KNOB,))}
    assert effects == {0.0: 1, 0.25: 0, 1.0: 0}


def test_beam_cut_miss():
    # A budget of 9 keeps the whole pool, yet 23 was never extended (beam width 2): nothing under it to accept,
    # while 31 sits at depth 2 under 21 and 22.
    trace = dart_step(new_trace(replace(CFG, node_budget=9)), [23, 31])
    m = step_miss(trace, 1)
    assert (m.depth, m.token, m.reason, m.rank, m.row_rank, m.elsewhere) == (2, 31, BEAM, None, 0, True)
    assert m.text() == ("wanted “<31>” at depth 2: " + REASON_TEXT[BEAM] + "; the head's guess no. 1 there"
                        "; the tree had it at that depth under another parent")
    # A beam of 3 or more extends 23: 23 31 (-2.590) is then the pool's rank 8, inside the budget of 9.
    effects = search_effects(trace, None, knobs=(BEAM_KNOB,))
    assert [(e.value, e.extra_tokens, e.extra_nodes) for e in effects] == [(v, 1, 0.0) for v in (5, 10, 20, 40)]


def test_eos_parent_miss():
    # EOS heads row 1: kept (rank 0) and accepted, but an EOS sequence is never extended.
    trace = dart_step(new_trace(), [EOS, 31], rows=[[EOS, 21, 22], [31, 32, 33]])
    assert trace.steps[1].tree.tokens[trace.steps[1].path[-1]] == EOS
    m = step_miss(trace, 1)
    assert (m.depth, m.token, m.reason, m.rank, m.row_rank, m.elsewhere) == (2, 31, EOS_PARENT, None, 0, False)
    assert REASON_TEXT[EOS_PARENT] in m.text()


def test_not_in_topk_miss():
    trace = dart_step(new_trace(), [21, 40])           # 40 is not among the depth-2 row's guesses
    m = step_miss(trace, 1)
    assert (m.depth, m.token, m.reason, m.rank, m.row_rank, m.elsewhere) == (2, 40, NOT_IN_TOPK, None, None, False)
    assert m.text() == "wanted “<40>” at depth 2: " + REASON_TEXT[NOT_IN_TOPK]


def test_beyond_the_rows():
    trace = dart_step(new_trace(), [21, 31, 50])       # both rows accepted (21 31 is kept): 50 is at depth 3
    assert trace.steps[1].accepted == 2
    m = step_miss(trace, 1)
    assert (m.depth, m.token, m.reason, m.rank, m.row_rank, m.elsewhere) == (3, 50, BEYOND, None, None, False)
    assert m.text() == "wanted “<50>” at depth 3: " + REASON_TEXT[BEYOND]


def in_tree_trace() -> Trace:
    """Sampled: the target rejected 21 31 (kept, rank 1) after accepting 21, yet 31 is what it committed there."""
    return dart_step(new_trace(sampling=SamplingConfig(temperature=0.7)), [21, 31], accepted=1)


def test_in_tree_miss_of_a_sampled_run():
    trace = in_tree_trace()
    assert trace.steps[1].accepted == 1 and len(trace.steps[1].path) == 2
    m = step_miss(trace, 1)
    assert (m.depth, m.token, m.reason, m.rank, m.row_rank) == (2, 31, IN_TREE, 1, 0)
    assert REASON_TEXT[IN_TREE] in m.text() and "would have caught it" not in m.text()


def test_in_tree_miss_is_not_elsewhere():
    m = step_miss(in_tree_trace(), 1)
    # The only 31 at depth 2 is the one under the accepted 21: there is no other parent.
    assert not m.elsewhere and "another parent" not in m.text()


# ---------------------------------------------------------------------------------------------- nothing missed
def test_steps_that_missed_nothing():
    # Fully accepted and cut by the token limit: the step's tokens are its accepted drafts only.
    full = dart_step(new_trace(), [21, 31])
    assert full.steps[1].accepted == 2 and step_miss(full, 1) is None
    assert step_miss(full, 0) is None                   # the prefill drafts nothing
    # Plain decoding: a one-node tree and no rows.
    plain = new_trace(method="vanilla")
    plain.steps.append(StepRecord(1, "verify", len(PROMPT), [21], tree=TokenTree([ROOT], [-1]), path=[0]))
    assert step_miss(plain, 1, PROBE) is None and run_misses(plain, PROBE) == []
    assert budget_effects(plain) == [] and lookup_effects(plain, max_ngram=3) == []


# ------------------------------------------------------------------------------------------ the lookup flag
def test_lookup_flag_where_the_run_had_no_branch():
    trace = two_steps()
    # Step 1's context ends "... 12 20": the latest earlier 20 (in the prompt) is followed by 21 32 40 11 12,
    # which spells the accepted 21, then the wanted 32.
    assert PROBE.lookup(trace.context_at(1)) == [21, 32, 40, 11, 12]
    m = step_miss(trace, 1, PROBE)
    assert m.lookup and m.reason == BUDGET
    assert m.text().endswith("; the prompt-lookup branch (dart_pld) would have offered it")
    assert not step_miss(trace, 1).lookup and "prompt-lookup branch" not in step_miss(trace, 1).text()
    # Step 2's context ends "20 21 32": the branch copies 40 11 ..., not the accepted 22 then 31.
    assert PROBE.lookup(trace.context_at(2))[:2] == [40, 11] and not step_miss(trace, 2, PROBE).lookup
    # A dart_pld run had its own branch: the flag is not for it.
    pld = replace(trace, method="dart_pld", settings=replace(trace.settings, lookup_tokens=5))
    assert not step_miss(pld, 1, PROBE).lookup


# ------------------------------------------------------------------------------------------ what the knobs recover
def test_budget_effects_by_hand():
    # Along the target's tokens the pool ranks are [0, 3] in step 1 (21 32; step 2's 22 is past the rows) and
    # [2, 5] in step 2 (22 31); each step accepted 1 with 3 nodes, out of a pool of 9.
    effects = {e.value: e for e in budget_effects(two_steps(), budgets=(2, 3, 4, 6, 12))}
    got = {b: (e.extra_tokens, e.extra_nodes) for b, e in effects.items()}
    assert got == {2: (-1, -1.0),   # step 1 still 1, step 2 loses 22 (rank 2)
                   3: (0, 0.0),     # the run's own budget
                   4: (1, 1.0),     # step 1 gains 32 (rank 3)
                   6: (2, 3.0),     # and step 2 gains 31 (rank 5)
                   12: (2, 6.0)}    # nothing more; the tree stops at the pool's 9 nodes
    assert effects[4].text() == "node budget 4: +1 tokens in this run, +1.0 nodes per forward"


def test_lookup_effects_by_hand():
    # Step 1's branch is 21 32 40 11 12: it agrees with the target for 2 tokens, and the tree already holds 21.
    # Step 2's branch is 40 11 12 20 21: it agrees for none, and none of it is in the pool.
    #   length 1: step 1 [21]  -> 1 accepted (as before), +0 nodes;  step 2 [40]    -> +0, +1 node
    #   length 2: step 1 [21 32] -> 2 accepted (+1),     +1 node;    step 2 [40 11] -> +0, +2 nodes
    #   length 5: step 1 -> 2 accepted (+1), +4 nodes;               step 2 -> +0, +5 nodes
    effects = lookup_effects(two_steps(), max_ngram=3, lengths=(0, 1, 2, 5))
    assert [(e.value, e.extra_tokens, e.extra_nodes) for e in effects] == [(1, 0, 0.5), (2, 1, 1.5), (5, 1, 4.5)]
    assert effects[-1].text() == "lookup branch 5: +1 tokens in this run, +4.5 nodes per forward"


def test_run_forensics_puts_the_parts_together():
    trace = two_steps()
    found = run_forensics(trace, lookup_ngram=3, lookup_tokens=5)
    assert found.misses == [step_miss(trace, 1, PROBE), step_miss(trace, 2, PROBE)]
    assert found.counts == {BUDGET: 2} and found.notes == []
    assert found.budgets == budget_effects(trace)
    assert found.knobs == lookup_effects(trace, 3) + search_effects(trace, None)
    assert "estimated: the run was sampled" in run_forensics(in_tree_trace(), 3, 5).notes
