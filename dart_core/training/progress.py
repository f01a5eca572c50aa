"""The training progress bar: steps, the running loss and acceptance estimates, anchor tokens per second (all
processes together) and the time left, which is the sooner of the schedule's end and the --minutes limit."""

from __future__ import annotations

import math
import time

from tqdm import tqdm


def duration(seconds: float) -> str:
    """1h02m, 4m05s, 12s."""
    if not math.isfinite(seconds):
        return "?"
    s = int(max(seconds, 0))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    def __init__(self, total_steps: int, step: int, deadline: float, enabled: bool = True):
        """deadline: time.time() at which the run stops (math.inf without a time limit)."""
        self.total, self.first_step, self.deadline = total_steps, step, deadline
        self.started, self.tokens = time.time(), 0
        self.running: dict[str, float] = {}
        self.bar = tqdm(total=total_steps, initial=step, desc="training head", unit="step", disable=not enabled)

    def update(self, step: int, stats: dict) -> dict:
        """After optimizer step `step`: stats holds this step's anchor tokens (all processes) and its mean loss,
        row-0 top-1 and chain tau. Returns what the bar shows (tokens_per_s, seconds_left, the running values)."""
        self.tokens += stats["tokens"]
        for key in ("loss", "row0", "chain_tau"):   # exponential means over about 20 steps
            old = self.running.get(key)
            self.running[key] = stats[key] if old is None else 0.95 * old + 0.05 * stats[key]
        elapsed = max(time.time() - self.started, 1e-9)
        done = step - self.first_step
        left = min((self.total - step) * elapsed / max(done, 1), self.deadline - time.time())
        shown = {**self.running, "tokens_per_s": self.tokens / elapsed, "seconds_left": left}
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{shown['loss']:.3f}", row0=f"{shown['row0']:.2f}",
                             chain_tau=f"{shown['chain_tau']:.2f}", tok_s=f"{shown['tokens_per_s']:.0f}",
                             left=duration(left))
        return shown

    def close(self) -> None:
        self.bar.close()
