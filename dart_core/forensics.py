"""Missed-token forensics: for every DART step that stopped short, the token the target wanted at the first rejected
position and why the tree did not hold it; and, over a run, what other node budgets would have recovered.

Everything is read from a trace, with no model. For greedy runs it is exact: the target's choices after a step are
the tokens the run committed next (lossless decoding), and the search's candidate pool does not depend on the node
budget, so the tree of any budget is the pool's top b (see dart_core.budget). For sampled runs the committed tokens
stand in for the target's choices: an estimate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from .budget import accepted_by_budget, pool_path, pool_ranks
from .trace import StepRecord, Trace
from .tree_search import EOS_END, KEPT, LOW_NGRAM

# Why the wanted token was not accepted, from the head's side to the verifier's.
BEYOND, NOT_IN_TOPK, BEAM, EOS_PARENT, BUDGET, NGRAM, IN_TREE = (
    "beyond_rows", "not_in_topk", "beam_cut", "eos_parent", "node_budget", "low_ngram", "in_tree")
REASON_TEXT = {
    BEYOND: "deeper than the head drafts",
    NOT_IN_TOPK: "not among the head's top-k guesses for that position",
    BEAM: "among the head's guesses, but its parent was cut by the beam width",
    EOS_PARENT: "its parent ends the text, so it was never extended",
    BUDGET: "in the search's pool, but below the node budget",
    NGRAM: "pruned by the n-gram term (an unseen n-gram)",
    IN_TREE: "in the tree, but the sampled target chose otherwise",
}


@dataclass
class Miss:
    step: int
    depth: int                 # tree depth of the wanted token (accepted drafts + 1)
    token: int                 # what the target wanted there
    reason: str                # a key of REASON_TEXT
    rank: int | None = None    # its place in the pool's ranking: node budget rank + 1 would have caught it
    row_rank: int | None = None  # its place among the head's guesses for that position (0 = the head's first)
    elsewhere: bool = False    # the tree held that token at that depth, under another parent

    def text(self, token_text=lambda t: f"<{t}>") -> str:
        """One line: 'wanted “x” at depth 2: in the search's pool, but below the node budget (rank 14: ...)'."""
        out = f"wanted “{token_text(self.token)}” at depth {self.depth}: {REASON_TEXT[self.reason]}"
        if self.rank is not None and self.reason in (BUDGET, NGRAM):
            out += f" (pool rank {self.rank + 1}: a node budget of {self.rank + 1} would have caught it)"
        if self.row_rank is not None and self.reason != NOT_IN_TOPK:
            out += f"; the head's guess no. {self.row_rank + 1} there"
        if self.elsewhere:
            out += "; the tree had it at that depth under another parent"
        return out


def step_miss(trace: Trace, index: int) -> Miss | None:
    """Why step `index` stopped where it did, or None (not a drafted DART step, or nothing was missed)."""
    step = trace.steps[index]
    if step.rows_tokens is None or step.candidates is None or step.tree is None:
        return None
    wanted = step.new_tokens[step.accepted] if len(step.new_tokens) > step.accepted else None
    if wanted is None:   # the step's tokens were cut by the token limit: nothing was missed
        return None
    depth = step.accepted + 1
    accepted = [int(t) for t in step.new_tokens[:step.accepted]]
    elsewhere = any(step.tree.depths[n] == depth and step.tree.tokens[n] == wanted for n in range(1, len(step.tree)))
    if depth > step.rows_tokens.shape[0]:
        return Miss(index, depth, wanted, BEYOND, elsewhere=elsewhere)
    row = [int(t) for t in step.rows_tokens[depth - 1]]
    if wanted not in row:
        return Miss(index, depth, wanted, NOT_IN_TOPK, elsewhere=elsewhere)
    c = step.candidates
    walk = pool_path(c.token, c.parent, accepted + [wanted])
    if len(walk) < len(accepted):   # the accepted path came from the lookup branch, outside the pool
        return None
    if len(walk) == len(accepted):  # the pool never held the wanted token under that path
        parent = walk[-1] if walk else -1
        reason = EOS_PARENT if parent >= 0 and c.beam[parent] == EOS_END else BEAM
        return Miss(index, depth, wanted, reason, row_rank=row.index(wanted), elsewhere=elsewhere)
    i = walk[-1]
    rank = int(pool_ranks(c)[i])
    reason = {KEPT: IN_TREE, LOW_NGRAM: NGRAM}.get(str(c.fate[i]), BUDGET)
    return Miss(index, depth, wanted, reason, rank=rank, row_rank=row.index(wanted), elsewhere=elsewhere)


def run_misses(trace: Trace) -> list[Miss]:
    return [m for i in range(len(trace.steps)) if (m := step_miss(trace, i)) is not None]


def miss_counts(trace: Trace) -> dict[str, int]:
    """How many steps stopped for each reason (in REASON_TEXT's order)."""
    counts = Counter(m.reason for m in run_misses(trace))
    return {r: counts[r] for r in REASON_TEXT if counts[r]}


@dataclass
class BudgetEffect:
    budget: int
    extra_tokens: int          # accepted draft tokens beyond the run's own, over the whole run
    extra_nodes: float         # more tree nodes per verify step than the run had (negative: fewer)


def budget_effects(trace: Trace, budgets=(2, 4, 8, 12, 16, 24, 32, 48, 60)) -> list[BudgetEffect]:
    """What each node budget would have accepted over the run, from the recorded pools (full candidates needed:
    a trace saved with top_candidates holds only part of each pool)."""
    steps = [(i, s) for i, s in enumerate(trace.steps) if _has_pool(s)]
    if not steps:
        return []
    output = trace.output_ids
    starts = np.cumsum([0] + [len(s.new_tokens) for s in trace.steps])
    b = np.asarray(budgets)
    accepted = np.zeros(len(b))
    nodes = np.zeros(len(b))
    own_accepted = own_nodes = 0
    for i, s in steps:
        c = s.candidates
        rows = s.rows_tokens.shape[0]
        future = output[starts[i]: starts[i] + rows]         # the target's tokens after this step's root
        branch = [s.tree.tokens[n] for n in s.tree.path_to(max(s.lookup_nodes))[1:]] if s.lookup_nodes else []
        a, n = accepted_by_budget(c.token, c.parent, pool_ranks(c), branch, list(future), b)
        accepted += a
        nodes += n
        own_accepted += s.accepted
        own_nodes += len(s.tree) - 1
    return [BudgetEffect(int(budget), int(round(accepted[j] - own_accepted)), (nodes[j] - own_nodes) / len(steps))
            for j, budget in enumerate(b)]


def _has_pool(s: StepRecord) -> bool:
    return s.candidates is not None and len(s.candidates) > 0 and s.rows_tokens is not None and s.tree is not None
