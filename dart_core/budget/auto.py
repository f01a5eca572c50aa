"""A tree sized to the hardware: the node budget that maximises expected tokens per second.

    rate(b) = E[tokens per step | b] / (drafting and search time + t(1 + nodes(b)))

t(k) is the machine's measured verify cost curve. E[tokens per step | b] is learnt from the run's own steps, exactly:
once the target's own continuation after a step is known (it is what the following steps commit), the tokens that
step would have accepted under every budget b, and with a prompt-lookup branch of every length L, are read off its
candidate pool (dart_core.budget.pool, which also holds the rate formula): dart_pld chooses the branch's length with the
budget, from one lookup of the longest.

For greedy decoding these counts are exact; under sampling they use the sampled continuation, an estimate.

Each choice weighs the curve as the run measures it (`run_curve`): at every tree size verified at least MIN_VERIFIES
times among the run's latest RECENT_VERIFIES verifies, the median of those times; between and beyond those sizes, the
curve times the ratio measured at the nearest of them. A curve measured apart from decoding can be off by a different
factor at each size (the context's length, what ran just before, a busy spell while it was measured). Only the latest
verifies count, whatever their size: a size the run stopped verifying (plain decoding's one row, while trees are
chosen) is weighed at its neighbours' ratio, not at times from another hour. Kept by size however old, such times
locked choices in: dart_pld ran 0.84x our plain lane on the full sets, 0.97x with the latest verifies alone.

The curve is also checked against the run as a whole: every CHECK_STEPS verify steps, the median of measured / predicted
verify time. Where it is off by more than CURVE_TOLERANCE either way (a curve measured while another job held the
cores, a machine that changed), the curve is measured again (once: `remeasure`, which also replaces the cached one),
and if it still disagrees, scaled by what the run measured. A measurement costs many verifies of every size (11-14 s
on a 2-core AVX2 EPYC, where a busy neighbour slows a run by half for a few dozen steps at a time): it is made only
where it would cost at most REMEASURE_SHARE of the verify time the run has spent so far, and the curve is scaled
instead until then (docs/cpu-speed.md, section 25).

Where no budget beats plain decoding (1 token per t(1), no drafting at all), the choice is budget 0: the proposer
then skips the draft head and the search, so DART costs what plain decoding costs, or, with a lookup branch, verifies
the branch alone where that pays (dart_core.budget.branch_alone). Probe steps keep measuring whether drafting pays
again: PROBE_EVERY steps after plain decoding is chosen, and each time it is chosen again, twice as many steps later
(up to PROBE_EVERY_MAX; a new prompt starts again from PROBE_EVERY). A probe costs the head's catching up and a tree
that did not pay (docs/cpu-speed.md, section 24).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..machine.records import CostCurve
from .branch_alone import BranchAlone
from .pool import CandidatePool, expected_rate
from .step_budget import BudgetChoice, CurveFix
from ..tree_search import Candidates

MAX_BUDGET = 60          # the reference's tree size: the largest budget considered on a CPU
GPU_MAX_BUDGET = 255     # on a GPU a verify of 256 rows can cost about what one row does: trees up to the largest
                         # fixed-shape bucket (dart_core.fixed_step) are considered
RECHOOSE_EVERY = 4       # verify steps between two choices (each choice uses every step settled so far)
MIN_STEPS = 2            # settled steps before the first choice replaces the starting budget
WHOLE = 2**31 - 1        # "the whole branch", where its length is not chosen
PROBE_EVERY = 8          # while plain decoding is chosen, draft a step after this many to keep measuring,
PROBE_EVERY_MAX = 64     # twice as many after each probe that chose plain decoding again, up to this many
# Plain decoding is chosen only when the curve says it beats the best tree by this much: its estimate leaves out what
# the plain mode still pays (feature taps, the head catching up, the probes); measurements:
# docs/cpu-speed.md#measured-plain-decodings-margin.
PLAIN_MARGIN = 1.1
CHECK_STEPS = 8          # verify steps whose measured times are held against the curve at once (their median)
CURVE_TOLERANCE = 1.5    # measured / predicted beyond this (or below its inverse): the curve disagrees with the run
REMEASURE_SHARE = 0.05   # a mid-run measurement of the curve may cost at most this share of the run's verify time
RECENT_VERIFIES = 32     # the latest verifies whose times correct the curve
MIN_VERIFIES = 3         # a size's own times stand in for the curve's where the latest verifies hold this many


def max_budget_for(device_type: str) -> int:
    """The largest node budget the automatic budget considers on this kind of device."""
    return GPU_MAX_BUDGET if device_type == "cuda" else MAX_BUDGET


@dataclass
class _Pending:
    position: int              # index of the step's root in the context
    pool: CandidatePool                 # the step's candidate pool, ranked
    branch: list[int]          # the prompt-lookup branch's tokens (empty without one)
    rows: int                  # the pool's depth


class AutoBudget:
    """Chooses the node budget (and, with a lookup branch, its length) as the run goes: `budget_for` before each
    search, then `lookup_tokens` is the branch length to graft; `remember` after the search, with the branch looked
    up at its longest."""

    def __init__(self, curve: CostCurve, start: int, max_budget: int = MAX_BUDGET, remeasure=None,
                 remeasure_cost=None, rechoose_every: int = RECHOOSE_EVERY):
        """remeasure: a function that measures the cost curve again (None: a disagreeing curve is only scaled);
        remeasure_cost: the seconds that takes on the machine a given curve describes (None: made whatever it costs);
        rechoose_every: verify steps between two choices (studies/rechoose.py weighs it against one choice a run)."""
        self.curve, self.start, self.max_budget = curve, int(start), int(max_budget)
        self.rechoose_every = int(rechoose_every)
        self.remeasure, self.remeasure_cost, self._ratios = remeasure, remeasure_cost, []
        self.verified_seconds = 0.0                      # the run's verify time so far
        self._verifies: deque = deque(maxlen=RECENT_VERIFIES)   # the run's latest verifies: (tokens, seconds)
        self.choice_curve = curve                        # the curve as the run measures it, at the last choice
        # seconds spent re-measuring the curve mid-run: machine calibration, not decoding (the bench reports it apart)
        self.calibration_seconds = 0.0
        self.budgets = np.arange(self.max_budget + 1)
        self.overhead, self._timed = 0.0, 0              # mean seconds of drafting and search per step
        self.pending: list[_Pending] = []
        self.budget, self.choice = self.start, None
        self.choice_record: BudgetChoice | None = None  # the choice as each step records it (made once per choice)
        self._since_choice = 0
        self._probe_every = PROBE_EVERY                  # plain steps until the next probe
        self.chooses_lookup = False
        self._learn([WHOLE])                             # the lookup branch (if any) is grafted whole
        self.alone: BranchAlone | None = None            # the lookup branch alone, where the length is chosen
        self.alone_tokens = 0                            # with budget 0: the branch alone, this long (0: none)

    def choose_lookup(self, lengths, start: int) -> None:
        """Choose the prompt-lookup branch's length too, among `lengths` (0: no branch), from `start` until the
        first choice; the proposer then looks the branch up at the longest and grafts `lookup_tokens` of it."""
        self.chooses_lookup = True
        self._learn(sorted({int(n) for n in lengths}))
        self.lookup_tokens = int(start) if start in self.lengths else int(self.lengths[-1])
        self.alone = BranchAlone(self.lengths)

    def _learn(self, lengths) -> None:
        self.lengths = np.asarray(lengths)
        self.accepted = np.zeros((len(self.lengths), self.max_budget + 1))  # summed over settled steps, per length
        self.nodes = np.zeros((len(self.lengths), self.max_budget + 1))     # and budget
        self.steps = 0                                   # settled steps
        self.lookup_tokens = int(self.lengths[-1])

    def reset(self) -> None:
        """A new prompt: its context is unrelated to the pending steps' (what was learnt stays)."""
        self.pending = []
        if self.alone is not None:
            self.alone.reset()
        self._probe_every = PROBE_EVERY

    def budget_for(self, context: list[int]) -> int:
        """The budget of the next step, re-chosen every few steps from everything settled so far; 0 means plain
        decoding (no drafting), except on probe steps."""
        self._settle(context)
        self._since_choice += 1
        was_plain = self.budget == 0
        every = self._probe_every if was_plain else self.rechoose_every
        if self.steps >= MIN_STEPS and (self.choice is None or self._since_choice >= every):
            self.choice, self._since_choice = self.best(), 0
            self.choice_record, self.budget = self.choice.recorded(), self.choice.budget
            self.lookup_tokens = int(self.lengths[0]) if self.choice.lookup_tokens is None else self.choice.lookup_tokens
            self.alone_tokens = self.choice.alone_tokens
            if self.budget == 0:
                self._probe_every = min(2 * self._probe_every, PROBE_EVERY_MAX) if was_plain else PROBE_EVERY
                return self.choice.best_drafting   # the first plain step is a probe: measuring goes on
        return self.budget

    def remember(self, context: list[int], pool: CandidatePool | Candidates | None, branch: list[int],
                 seconds: float) -> None:
        """Keep this step's pool (a search's `CandidatePool`, or the candidates it recorded; and its lookup branch, at
        the longest length) until the target's continuation after it is known."""
        self._timed += 1
        self.overhead += (seconds - self.overhead) / self._timed
        if pool is None or not pool.token.size:
            return
        self.pending.append(_Pending(len(context) - 1, CandidatePool.of(pool), list(branch[:self.lengths[-1]]),
                                     int(pool.level.max()) + 1))

    def remember_alone(self, context: list[int], ngram: int, branch: list[int]) -> None:
        """This step's lookup branch at the longest, after an n-gram of `ngram` tokens (BranchAlone.remember)."""
        if self.alone is not None:
            self.alone.remember(context, ngram, branch)

    def observe_verify(self, tokens: int, seconds: float) -> CurveFix | None:
        """A verify of `tokens` tokens took `seconds`. Every CHECK_STEPS of them, the curve is checked; returns what
        was done when it disagreed, else None."""
        self._verifies.append((int(tokens), seconds))
        self.verified_seconds += seconds
        self._ratios.append(seconds / self.curve.time(tokens))
        if len(self._ratios) < CHECK_STEPS:
            return None
        ratio, self._ratios = float(statistics.median(self._ratios)), []   # numpy's median: 0.1 ms on 8 numbers
        if 1 / CURVE_TOLERANCE <= ratio <= CURVE_TOLERANCE:
            return None
        if self.remeasure is not None and self._remeasure_pays(ratio):
            t0 = time.perf_counter()
            self.curve, self.remeasure, action = self.remeasure(), None, "re-measured"
            self.calibration_seconds += time.perf_counter() - t0
        else:
            self.curve, action = self.curve.scaled(ratio), "scaled"
        self.choice = None            # choose again at the next step, on the new curve
        return CurveFix(round(ratio, 3), action, self.curve.recorded())   # as the step records it

    def _remeasure_pays(self, ratio: float) -> bool:
        """Whether measuring the curve again now costs at most REMEASURE_SHARE of the run's verify time so far."""
        if self.remeasure_cost is None:
            return True
        cost = ratio * self.remeasure_cost(self.curve)   # on the machine as the run measures it
        return cost <= REMEASURE_SHARE * self.verified_seconds

    def run_curve(self) -> CostCurve:
        """The cost curve as this run's latest verifies measure it: at each size among them often enough, the median
        of its times; elsewhere the curve times the ratio of the nearest such sizes (interpolated between two), never
        decreasing."""
        by_size: dict[int, list[float]] = {}
        for tokens, seconds in self._verifies:
            by_size.setdefault(tokens, []).append(seconds)
        sizes = sorted(k for k, times in by_size.items() if len(times) >= MIN_VERIFIES)
        if not sizes:
            return self.curve
        ratios = [float(np.median(by_size[k])) / self.curve.time(k) for k in sizes]
        rows = sorted(set(self.curve.rows) | set(sizes))
        seconds = np.maximum.accumulate(self.curve.times(rows) * np.interp(rows, sizes, ratios))
        return CostCurve(tuple(rows), tuple(float(t) for t in seconds), self.curve.context)

    def _settle(self, context: list[int]) -> None:
        keep = []
        for p in self.pending:
            needed = max(p.rows, len(p.branch))
            future = context[p.position + 1:]
            if len(future) < needed:      # the target has not yet said enough after this step
                keep.append(p)
                continue
            self._add(p, future[:needed])
        self.pending = keep
        if self.alone is not None:
            self.alone.settle(context)

    def _add(self, p: _Pending, target_path: list[int]) -> None:
        accepted, nodes = p.pool.accepted_by_length(p.branch, target_path, self.budgets, self.lengths)
        self.accepted += accepted
        self.nodes += nodes
        self.steps += 1

    def rate(self, budget: int, length: int | None = None) -> tuple[float, float]:
        """(expected tokens per step, expected tokens per second) under `budget` (and branch length `length`,
        default the current one), from the settled steps."""
        i = int(np.searchsorted(self.lengths, self.lookup_tokens if length is None else length))
        tokens, per_s = self._expected(self.accepted[i, budget], self.nodes[i, budget])
        return float(tokens), float(per_s)

    def rates(self) -> np.ndarray:
        """Expected tokens per second for every branch length and budget 1..max_budget, [lengths, budgets]."""
        return self._expected(self.accepted[:, 1:], self.nodes[:, 1:])[1]

    def _expected(self, accepted, nodes):
        """(tokens per step, tokens per second) from summed acceptance and nodes, scalars or arrays alike."""
        n = max(self.steps, 1)
        tokens = 1.0 + accepted / n
        return tokens, expected_rate(tokens, nodes / n, self.overhead, self.choice_curve)

    def best(self) -> BudgetChoice:
        self.choice_curve = self.run_curve()
        rates = self.rates()
        i, j = np.unravel_index(int(np.argmax(rates)), rates.shape)   # ties: the shorter branch, the smaller tree
        length, drafting = int(self.lengths[i]), 1 + int(j)
        plain = 1.0 / self.choice_curve.time(1)
        # without drafting: plain decoding, or the lookup branch alone where it beats that
        alone, alone_tokens, alone_per_s = self.alone.best(self.choice_curve) if self.alone is not None \
            else (0, 1.0, plain)
        budget = drafting if PLAIN_MARGIN * rates[i, j] >= alone_per_s else 0
        tokens, per_s = self.rate(drafting, length) if budget else (alone_tokens, alone_per_s)
        start = min(self.start, self.max_budget)
        n = max(self.steps, 1)
        return BudgetChoice(budget, length if self.chooses_lookup else None, float(tokens), float(per_s), self.steps,
                            float(self.rate(start)[1]), start, plain_tokens_per_s=plain, best_drafting=drafting,
                            overhead_s=self.overhead, tokens_by_budget=list(1.0 + self.accepted[i] / n),
                            nodes_by_budget=list(self.nodes[i] / n), alone_tokens=0 if budget else alone,
                            curve=None if self.choice_curve is self.curve else self.choice_curve)
