"""Missed-token forensics: for every DART step that stopped short, the token the target wanted at the first rejected
position and why the tree did not hold it; and, over a run, what each knob (the node budget, the prompt-lookup
branch, the n-gram weight, the beam width) would have recovered, everything else held as the run had it.

Everything is read from a trace, with no model. For greedy runs it is exact: the target's choices after a step are
the tokens the run committed next (lossless decoding), and the search's candidate pool does not depend on the node
budget, so the tree of any budget is the pool's top b (see dart_core.budget.pool); the lookup branch depends on the
context alone; and the n-gram weight and beam width are replayed by running the search again over the step's
recorded rows with the run's table. For sampled runs the committed tokens stand in for the target's choices: an
estimate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from ..ngram import NGramModel
from ..proposers import PromptLookupProposer
from ..budget.pool import CandidatePool, pool_path, pool_ranks
from ..trace import StepRecord, Trace
from ..tree_search import EOS_END, KEPT, LOW_NGRAM, search
from .replay import ReplayStep, replay_steps

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
    lookup: bool = False       # a run without a lookup branch: dart_pld's branch would have offered it

    def text(self, token_text=lambda t: f"<{t}>") -> str:
        """One line: 'wanted “x” at depth 2: in the search's pool, but below the node budget (rank 14: ...)'."""
        out = f"wanted “{token_text(self.token)}” at depth {self.depth}: {REASON_TEXT[self.reason]}"
        if self.rank is not None and self.reason in (BUDGET, NGRAM):
            out += f" (pool rank {self.rank + 1}: a node budget of {self.rank + 1} would have caught it)"
        if self.row_rank is not None and self.reason != NOT_IN_TOPK:
            out += f"; the head's guess no. {self.row_rank + 1} there"
        if self.elsewhere:
            out += "; the tree had it at that depth under another parent"
        if self.lookup:
            out += "; the prompt-lookup branch (dart_pld) would have offered it"
        return out


def step_miss(trace: Trace, index: int, lookup: PromptLookupProposer | None = None) -> Miss | None:
    """Why step `index` stopped where it did, or None (not a drafted DART step, or nothing was missed).
    `lookup`: the prompt-lookup branch to try where the run had none (it depends on the context alone)."""
    miss = _head_miss(trace, index)
    step = trace.steps[index]
    if miss is not None and lookup is not None and trace.settings.lookup_tokens is None and not step.lookup_nodes:
        wanted = step.new_tokens[:miss.depth]
        miss.lookup = lookup.lookup(trace.context_at(index))[:miss.depth] == wanted
    return miss


def _head_miss(trace: Trace, index: int) -> Miss | None:
    step = trace.steps[index]
    if step.rows_tokens is None or step.candidates is None or step.tree is None:
        return None
    wanted = step.new_tokens[step.accepted] if len(step.new_tokens) > step.accepted else None
    if wanted is None:   # the step's tokens were cut by the token limit: nothing was missed
        return None
    depth = step.accepted + 1
    accepted = [int(t) for t in step.new_tokens[:step.accepted]]
    parent = step.path[-1] if step.path else 0       # the last accepted node: its own child is not "elsewhere"
    elsewhere = any(step.tree.depths[n] == depth and step.tree.tokens[n] == wanted and step.tree.parents[n] != parent
                    for n in range(1, len(step.tree)))
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


def run_misses(trace: Trace, lookup: PromptLookupProposer | None = None) -> list[Miss]:
    return [m for i in range(len(trace.steps)) if (m := step_miss(trace, i, lookup)) is not None]


def miss_counts(misses: list[Miss]) -> dict[str, int]:
    """How many steps stopped for each reason (in REASON_TEXT's order)."""
    counts = Counter(m.reason for m in misses)
    return {r: counts[r] for r in REASON_TEXT if counts[r]}


# ---------------------------------------------------------------------------------------------- what the knobs recover
# The knobs, named as the search config and the run settings name them.
BUDGET_KNOB, LOOKUP_KNOB, NGRAM_KNOB, BEAM_KNOB = "node_budget", "lookup_tokens", "ngram_weight", "beam_width"
KNOB_VALUES = {
    BUDGET_KNOB: (2, 4, 8, 12, 16, 24, 32, 48, 60),
    LOOKUP_KNOB: (0, 3, 5, 8, 10),            # tokens of the prompt-lookup branch (0: none, plain DART)
    NGRAM_KNOB: (0.0, 0.25, 0.5, 1.0),
    BEAM_KNOB: (5, 10, 20, 40),
}


@dataclass
class KnobEffect:
    """One knob set to `value`, everything else as the run had it (each step's own node budget included)."""
    knob: str                  # a key of KNOB_VALUES
    value: float
    extra_tokens: int          # accepted draft tokens beyond the run's own, over the whole run
    extra_nodes: float         # more tree nodes per verify step than the run had (negative: fewer)

    @property
    def label(self) -> str:
        if self.knob == LOOKUP_KNOB:
            return f"lookup branch {self.value:g}" if self.value else "no lookup branch"
        return f"{self.knob.replace('_', ' ')} {self.value:g}"

    def text(self) -> str:
        """'node budget 12: +9 tokens in this run, +4.0 nodes per forward'."""
        return f"{self.label}: {self.extra_tokens:+d} tokens in this run, {self.extra_nodes:+.1f} nodes per forward"


@dataclass
class _Drafted(ReplayStep):
    """A drafted step with what its own tree was made of."""
    budget: int                # the step's own node budget (the tree is its pool's top `budget`)
    branch: list[int]          # the step's own prompt-lookup branch (empty without one)
    pool: CandidatePool                 # its own pool, ranked once


def _drafted_steps(trace: Trace, lookup: PromptLookupProposer | None) -> list[_Drafted]:
    longest = max(KNOB_VALUES[LOOKUP_KNOB])   # the target's tokens after each root: as many as any replay can use
    return [_Drafted(st.index, st.step, st.context, st.future, _own_budget(trace, st.step),
                     _own_branch(trace, st, lookup), CandidatePool.of(st.step.candidates))
            for st in replay_steps(trace, ahead=longest) if _has_pool(st.step)]


def _own_budget(trace: Trace, s: StepRecord) -> int:
    """The node budget the step's search ran with (a tree cut shorter by the context window keeps its size)."""
    search = trace.settings.search
    budget = s.budget.nodes if s.budget is not None else search.node_budget if search else len(s.tree) - 1
    kept = int((s.candidates.fate == KEPT).sum())
    return kept if kept < min(budget, len(s.candidates)) else budget


def _own_branch(trace: Trace, st: ReplayStep, lookup: PromptLookupProposer | None) -> list[int]:
    """The step's prompt-lookup branch: looked up again where the run had one, or read back from the tree's lookup
    nodes when no lookup is given."""
    if trace.settings.lookup_tokens is None and not st.step.lookup_nodes:
        return []
    return st.step.lookup_branch(lookup.lookup(st.context) if lookup is not None else None)


def _effects(steps: list[_Drafted], knob: str, values, pool_of, branch_of) -> list[KnobEffect]:
    """Each value's accepted tokens and nodes over the steps, against the run's own (read off each step's pool at
    its own budget: `pool_of(step, value)` gives the pool, `branch_of(step, value)` the lookup branch)."""
    extra_tokens, extra_nodes = np.zeros(len(values)), np.zeros(len(values))
    for st in steps:
        own_a, own_n = st.pool.accepted(st.branch, st.future, [st.budget])
        for j, value in enumerate(values):
            a, n = pool_of(st, value).accepted(branch_of(st, value), st.future, [st.budget])
            extra_tokens[j] += a[0] - own_a[0]
            extra_nodes[j] += n[0] - own_n[0]
    return [KnobEffect(knob, v, int(extra_tokens[j]), float(extra_nodes[j] / len(steps))) for j, v in enumerate(values)]


def budget_effects(trace: Trace, budgets=KNOB_VALUES[BUDGET_KNOB],
                   lookup: PromptLookupProposer | None = None) -> list[KnobEffect]:
    """What each node budget would have accepted over the run, from the recorded pools (full candidates needed:
    a trace saved with top_candidates holds only part of each pool). `lookup`: the run's own prompt-lookup branch,
    to look it up again (dart_pld); without it the branch is read from each tree."""
    steps = _drafted_steps(trace, lookup)
    if not steps:
        return []
    extra_tokens, extra_nodes = np.zeros(len(budgets)), np.zeros(len(budgets))
    for st in steps:
        a, n = st.pool.accepted(st.branch, st.future, budgets)
        extra_tokens += a - st.step.accepted
        extra_nodes += n - (len(st.step.tree) - 1)
    return [KnobEffect(BUDGET_KNOB, int(b), int(round(extra_tokens[j])), float(extra_nodes[j] / len(steps)))
            for j, b in enumerate(budgets)]


def lookup_effects(trace: Trace, max_ngram: int, lengths=KNOB_VALUES[LOOKUP_KNOB]) -> list[KnobEffect]:
    """What a prompt-lookup branch of each length (0: none) would have recovered, with each step's own search, against
    the run's own branch (fixed, or chosen per step by the automatic budget). Exact for greedy runs: the branch
    depends on the context alone (prompt lookup with `max_ngram`)."""
    own = trace.settings.lookup_tokens or 0         # with an automatic budget: the longest, cut per step
    chosen = any(s.budget is not None and s.budget.lookup is not None for s in trace.steps)
    lengths = [n for n in lengths if chosen or n != own]
    probes = {n: PromptLookupProposer(max_ngram=max_ngram, num_tokens=n) for n in {own, *lengths} if n}
    steps = _drafted_steps(trace, probes.get(own))
    if not steps or not lengths:
        return []
    branches = {(st.index, n): probes[n].lookup(st.context) if n else [] for st in steps for n in lengths}
    return _effects(steps, LOOKUP_KNOB, lengths, lambda st, n: st.pool, lambda st, n: branches[st.index, n])


def search_effects(trace: Trace, ngram: NGramModel | None, lookup: PromptLookupProposer | None = None,
                   knobs=(NGRAM_KNOB, BEAM_KNOB)) -> list[KnobEffect]:
    """What other n-gram weights and beam widths would have recovered: the search replayed over every step's
    recorded rows (with `ngram`, the run's table), each step at its own node budget and with its own lookup branch.
    Exact for greedy runs with a static table (a context-adaptive one, --ngram-context-weight, is replayed without
    what it learnt from the context)."""
    base = trace.settings.search
    steps = _drafted_steps(trace, lookup)
    if base is None or not steps:
        return []
    eos = frozenset(trace.settings.stop_ids)
    out = []
    for knob in knobs:
        values = [v for v in KNOB_VALUES[knob] if v != getattr(base, knob)]
        pools = {(st.index, v): CandidatePool.of(search(st.step.rows_tokens, st.step.rows_probs, st.context, replace(
                     base, **{knob: v}), ngram, eos, node_budget=st.budget).candidates) for st in steps for v in values}
        out += _effects(steps, knob, values, lambda st, v: pools[st.index, v], lambda st, v: st.branch)
    return out


def needs_table(trace: Trace) -> bool:
    """Whether replaying the run's search needs its n-gram table (the search used an n-gram term)."""
    return any(s.candidates is not None and (s.candidates.ngram_match >= 0).any() for s in trace.steps)


def _has_pool(s: StepRecord) -> bool:
    return s.candidates is not None and len(s.candidates) > 0 and s.rows_tokens is not None and s.tree is not None


@dataclass
class RunForensics:
    """A run's misses and what the knobs would have recovered, as the views show them."""
    misses: list[Miss]
    budgets: list[KnobEffect]       # other node budgets
    knobs: list[KnobEffect]         # the lookup branch and, replayed, the n-gram weight and the beam width
    notes: list[str]                # what was left out or is only an estimate

    @property
    def counts(self) -> dict[str, int]:
        return miss_counts(self.misses)


def run_forensics(trace: Trace, lookup_ngram: int, lookup_tokens: int, ngram: NGramModel | None = None,
                  replay: bool = True) -> RunForensics:
    """Everything above for one run. The prompt-lookup branch is prompt lookup with `lookup_ngram`, of the run's
    own length (dart_pld) or `lookup_tokens` (what dart_pld would add to a dart run). `replay`: also run the search
    again for the n-gram weight and beam width (a few searches per step: leave it for finished runs)."""
    own = trace.settings.lookup_tokens
    probe = PromptLookupProposer(max_ngram=lookup_ngram, num_tokens=own or lookup_tokens)
    own_lookup = probe if own else None
    notes = []
    if not trace.settings.sampling.greedy:
        notes.append("estimated: the run was sampled")
    if trace.settings.top_candidates is not None:
        notes.append("the trace keeps part of each pool: larger budgets are underestimated")
    knobs = lookup_effects(trace, lookup_ngram)
    if replay and ngram is None and needs_table(trace):
        notes.append("n-gram weight and beam width not replayed: the run's n-gram table is not loaded")
    elif replay:
        knobs += search_effects(trace, ngram, own_lookup)
        if trace.settings.ngram_context_weight:
            notes.append("replayed with the static table (the run's context-adaptive part is left out)")
    return RunForensics(run_misses(trace, probe), budget_effects(trace, lookup=own_lookup), knobs, notes)
