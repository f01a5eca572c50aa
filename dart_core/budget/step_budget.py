"""A DART step's node budget as the step records it: `StepBudget` (fixed, or chosen by the automatic budget), the
`BudgetChoice` behind an automatic one, and the cost curve's `CurveFix` when the run corrected it. Each owns its file
form (reading what older traces wrote) and its one line of text; dart_core.budget.auto makes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from ..machine.records import CostCurve


@dataclass
class BudgetChoice:
    """One choice of the automatic budget, with the estimates behind it."""
    budget: int
    lookup_tokens: int | None        # the prompt-lookup branch's length with it (0: none; None: not chosen)
    expected_tokens: float           # per verify step, the bonus token included
    expected_tokens_per_s: float
    steps_seen: int                  # settled steps the estimate comes from
    start_tokens_per_s: float        # the same estimate for the starting budget, for comparison
    start: int
    plain_tokens_per_s: float = 0.0  # plain decoding on the same cost curve: what budget 0 gives
    best_drafting: int = 0           # the best budget above 0 (what a probe step uses)
    alone_tokens: int = 0            # with budget 0: the lookup branch alone, up to this many tokens (0: plain)
    overhead_s: float = 0.0          # mean drafting and search time per step
    tokens_by_budget: list[float] = field(default_factory=list)   # expected tokens per step for budget 0, 1, ...
    nodes_by_budget: list[float] = field(default_factory=list)    # expected tree nodes (the lookup branch's too)
    # (both at the chosen branch length)
    curve: CostCurve | None = None   # the cost curve the choice weighed, the machine's as the run's verifies measured
    # it (None: the machine's, the run had measured none of its sizes yet)

    def text(self) -> str:
        """'2.31 tokens per step expected, 45.2 tok/s, from 12 steps'."""
        return (f"{self.expected_tokens:.2f} tokens per step expected, {self.expected_tokens_per_s:.1f} tok/s, "
                f"from {self.steps_seen} steps")

    def _estimates(self) -> dict:
        """Every field but the curve, rounded as the file keeps it."""
        return {f.name: _rounded(getattr(self, f.name)) for f in fields(self) if f.name != "curve"}

    def to_dict(self) -> dict:
        d = self._estimates()
        if not self.alone_tokens:   # files written before the branch alone existed read the same
            del d["alone_tokens"]
        if self.curve is not None:
            d["curve"] = self.curve.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BudgetChoice":
        """As to_dict wrote it; older files lack the fields added since (their defaults)."""
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names}
        for name in ("tokens_by_budget", "nodes_by_budget"):
            known[name] = [float(x) for x in known.get(name) or []]
        known["curve"] = CostCurve.from_dict(known["curve"]) if known.get("curve") else None
        return cls(**{"lookup_tokens": None, **known})

    def recorded(self) -> "BudgetChoice":
        """The choice as a step records it (its estimates rounded as the file keeps them): what from_dict(to_dict())
        gives, made directly (the automatic budget makes one every few steps)."""
        return BudgetChoice(**self._estimates(), curve=None if self.curve is None else self.curve.recorded())


def _rounded(v):
    """A BudgetChoice field as its file keeps it: estimates to 4 places, the per-budget lists to 3 (by numpy: a GPU's
    lists have 256 entries, rounded one by one 0.14 ms a choice)."""
    return np.round(np.asarray(v, dtype=np.float64), 3).tolist() if isinstance(v, list) \
        else round(float(v), 4) if isinstance(v, float) else v


@dataclass
class CurveFix:
    """The cost curve corrected against the run's own verify times (dart_core.budget.auto.AutoBudget.observe_verify)."""
    ratio: float                     # measured / predicted verify time: the median of a few steps
    action: str                      # "re-measured" or "scaled"
    curve: CostCurve                 # the curve from then on

    def text(self) -> str:
        return f"the cost curve was {self.action}: verifies took {self.ratio:.2f}× what it said"

    def to_dict(self) -> dict:
        return {"ratio": self.ratio, "action": self.action, "curve": self.curve.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "CurveFix":
        return cls(float(d["ratio"]), str(d["action"]), CostCurve.from_dict(d["curve"]))


@dataclass
class StepBudget:
    """A DART step's node budget and how it was set: fixed, or chosen by the automatic budget (with the choice in
    force, a correction of the cost curve just before the step, and the lookup branch's length it grafted)."""
    nodes: int                       # the search's node budget (0: plain decoding, nothing drafted)
    auto: bool = False
    choice: BudgetChoice | None = None   # the automatic choice behind it (None: fixed, or still measuring)
    curve: CurveFix | None = None        # the cost curve was corrected before this step
    lookup: int | None = None            # dart_pld with its length chosen: the branch's tokens grafted

    def branch_used(self, branch: list[int]) -> list[int]:
        """What the step grafted of a prompt-lookup branch looked up at its longest: its first `lookup` tokens where
        the length was chosen, else all of it."""
        return branch if self.lookup is None else branch[:self.lookup]

    def text(self) -> str:
        """How the step's node budget was set, in words."""
        if not self.auto:
            return f"node budget {self.nodes} (fixed)"
        if self.curve is not None:   # the run's own verify times disagreed with the cost curve before this step
            return f"{replace(self, curve=None).text()} · {self.curve.text()}"
        if self.nodes == 0 and self.choice is not None and self.choice.alone_tokens:
            return (f"prompt lookup's branch alone, up to {self.choice.alone_tokens} tokens: no drafted tree pays on "
                    "this machine (automatic budget)")
        if self.nodes == 0:
            return "plain decoding: no tree pays on this machine (automatic budget)"
        if self.choice is None:
            return f"node budget {self.nodes} (automatic, still measuring)"
        probe = " · a probe step" if self.choice.budget == 0 else ""
        lookup = f", lookup branch {self.lookup}" if self.lookup is not None else ""
        return f"node budget {self.nodes}{lookup} (automatic: {self.choice.text()}{probe})"

    def to_dict(self) -> dict:
        d = {"nodes": self.nodes, "auto": self.auto}
        if self.choice is not None:
            d["choice"] = self.choice.to_dict()
        if self.curve is not None:
            d["curve"] = self.curve.to_dict()
        if self.lookup is not None:
            d["lookup"] = self.lookup
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StepBudget":
        return cls(int(d["nodes"]), bool(d.get("auto", False)),
                   BudgetChoice.from_dict(d["choice"]) if d.get("choice") else None,
                   CurveFix.from_dict(d["curve"]) if d.get("curve") else None,
                   int(d["lookup"]) if d.get("lookup") is not None else None)
