"""One metrics object read by the CLI, the benchmark and the UI. Definitions follow Spec-Bench / vLLM.

The words are defined once, in dart_core.glossary.GLOSSARY (the app's glossary shows that text), and computed here:
- tau: GLOSSARY["τ (tau)"].
- tokens_per_forward: GLOSSARY["tokens per forward"]; forward_passes counts the forwards (verify steps + one
  prefill per generation observed).
- acceptance_by_depth[d-1], conditional_acceptance[d-1]: GLOSSARY["acceptance per position"], the share of steps
  that reached depth d and the conditional rate.
- tokens_per_s: emitted tokens / decode time, the wall time from the start of the prefill to the end of the last step
  less any re-measuring of the machine's cost curve in between (calibration_time, reported apart); a speedup,
  GLOSSARY["speedup"], is a ratio of these. `tokens_per_second` is that division: the bench's cells, the app's lanes
  and the report's stats use it too, so every tokens/s shown is defined here.
- phase_share: each per-step phase's share (draft, search, verify, accept) of their summed time; the prefill is
  left out, being paid once per generation rather than per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .trace import PHASES, StepRecord


def tokens_per_second(tokens: int, seconds: float) -> float:
    """Tokens per second: `tokens` emitted over the `seconds` they took (0.0 when no time was measured)."""
    return tokens / seconds if seconds > 0 else 0.0


@dataclass
class Metrics:
    new_tokens: int = 0
    verify_steps: int = 0
    prefills: int = 0               # generations observed (one prefill forward each)
    verify_tokens: int = 0          # tokens emitted by verify steps
    accepted_tokens: int = 0        # draft tokens accepted
    draft_nodes: int = 0            # draft nodes verified (roots excluded)
    accepted_hist: list[int] = field(default_factory=list)  # accepted_hist[a] = steps that accepted a drafts
    node_budgets: dict[str, int] = field(default_factory=dict)  # DART: verify steps per node budget used
    wall_time: float = 0.0
    calibration_time: float = 0.0   # of wall_time: the cost curve re-measured mid-run (machine set-up, not decoding)
    phase_time: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in ("prefill", *PHASES)})

    def observe(self, step: StepRecord) -> None:
        self.new_tokens += len(step.new_tokens)
        self.wall_time = step.elapsed
        for phase, seconds in step.timings.items():
            self.phase_time[phase] = self.phase_time.get(phase, 0.0) + seconds
        if step.kind == "prefill":
            self.prefills += 1
        if step.kind != "verify":
            return
        self.verify_steps += 1
        self.verify_tokens += len(step.new_tokens)
        self.accepted_tokens += step.accepted
        self.draft_nodes += len(step.tree) - 1 if step.tree else 0
        while len(self.accepted_hist) <= step.accepted:
            self.accepted_hist.append(0)
        self.accepted_hist[step.accepted] += 1
        if step.budget:
            key = str(step.budget.nodes)
            self.node_budgets[key] = self.node_budgets.get(key, 0) + 1

    def merge(self, other: "Metrics") -> None:
        """Add another run's counts and times to this one (wall times add up: runs are sequential)."""
        self.new_tokens += other.new_tokens
        self.verify_steps += other.verify_steps
        self.prefills += other.prefills
        self.verify_tokens += other.verify_tokens
        self.accepted_tokens += other.accepted_tokens
        self.draft_nodes += other.draft_nodes
        self.accepted_hist += [0] * (len(other.accepted_hist) - len(self.accepted_hist))
        for i, c in enumerate(other.accepted_hist):
            self.accepted_hist[i] += c
        self.wall_time += other.wall_time
        self.calibration_time += other.calibration_time
        for k, v in other.node_budgets.items():
            self.node_budgets[k] = self.node_budgets.get(k, 0) + v
        for k, v in other.phase_time.items():
            self.phase_time[k] = self.phase_time.get(k, 0.0) + v

    @classmethod
    def from_steps(cls, steps) -> "Metrics":
        m = cls()
        for s in steps:
            m.observe(s)
        return m

    @property
    def tau(self) -> float:
        return self.verify_tokens / self.verify_steps if self.verify_steps else 0.0

    @property
    def forward_passes(self) -> int:
        return self.verify_steps + self.prefills

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def decode_time(self) -> float:
        """The wall time less the calibration in it: the seconds spent decoding."""
        return max(self.wall_time - self.calibration_time, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return tokens_per_second(self.new_tokens, self.decode_time)

    @property
    def acceptance_by_depth(self) -> list[float]:
        if not self.verify_steps:
            return []
        at_least = [sum(self.accepted_hist[d:]) for d in range(1, len(self.accepted_hist))]
        return [c / self.verify_steps for c in at_least]

    @property
    def conditional_acceptance(self) -> list[float]:
        reached = [sum(self.accepted_hist[d:]) for d in range(len(self.accepted_hist))]
        return [reached[d] / reached[d - 1] for d in range(1, len(reached)) if reached[d - 1]]

    @property
    def phase_share(self) -> dict[str, float]:
        """Share of each per-step phase (PHASES) in their summed time, the prefill excluded (see the module doc)."""
        times = {p: self.phase_time.get(p, 0.0) for p in PHASES}
        total = sum(times.values())
        return {p: (t / total if total else 0.0) for p, t in times.items()}

    def to_dict(self) -> dict:
        return {"new_tokens": self.new_tokens, "verify_steps": self.verify_steps, "tau": round(self.tau, 4),
                "forward_passes": self.forward_passes, "tokens_per_forward": round(self.tokens_per_forward, 4),
                "accepted_tokens": self.accepted_tokens, "draft_nodes": self.draft_nodes,
                "tokens_per_s": round(self.tokens_per_s, 3), "wall_time": round(self.wall_time, 4),
                "calibration_time": round(self.calibration_time, 4),
                "acceptance_by_depth": [round(x, 4) for x in self.acceptance_by_depth],
                "conditional_acceptance": [round(x, 4) for x in self.conditional_acceptance],
                "phase_time": {k: round(v, 4) for k, v in self.phase_time.items()},
                "node_budgets": dict(sorted(self.node_budgets.items(), key=lambda kv: int(kv[0])))}
