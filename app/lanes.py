"""Streaming the decoding lanes (plain, DART, prompt lookup) side by side on one CPU, without threads.

The lanes are interleaved in one generator: each lane's `dart_core.decoding.generate` iterator is advanced by one
step in turn (round robin). Each lane's time is the sum of its own steps (measured around each `next()`), so the
lanes do not slow each other's numbers down. A stop flag is checked before every step: stopping takes effect
within one step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field

from dart_core.errors import DartError
from dart_core.methods import VANILLA, lane_of
from dart_core.metrics import Metrics, tokens_per_second
from dart_core.trace import PHASES, StepRecord, Trace

WAITING, RUNNING, DONE, STOPPED, ERROR, REPLAY = "waiting", "running", "done", "stopped", "error", "replay"
log = logging.getLogger(__name__)
STOP_REASONS = {"stop_token": "end of answer", "max_new_tokens": "token limit", "context_full": "context full"}


@dataclass
class Lane:
    key: str                                   # a key of methods.LANES (lane_of the trace's method)
    trace: Trace
    steps: Iterator[StepRecord] | None = None  # the live generator; None for a replayed trace
    seconds: float = 0.0                       # spent in this lane's own steps (lanes take turns on one CPU)
    status: str = WAITING
    error: str = ""
    on_step: Callable[[Trace, StepRecord], None] | None = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        return sum(len(s.new_tokens) for s in self.trace.steps)

    @property
    def tokens_per_s(self) -> float:
        return tokens_per_second(self.tokens, self.seconds)

    @property
    def metrics(self) -> Metrics:
        return Metrics.from_steps(self.trace.steps)

    @property
    def finished(self) -> bool:
        return self.status in (DONE, STOPPED, ERROR, REPLAY)

    def advance(self, lock=None) -> StepRecord | None:
        """Run this lane's next step. Returns the step, or None when the lane ended (or failed) instead."""
        if self.finished or self.steps is None:
            return None
        self.status = RUNNING
        with lock or nullcontext():
            t0 = time.perf_counter()
            try:
                step = next(self.steps)
            except StopIteration:
                self.status = DONE
                return None
            except DartError as exc:  # a user's mistake: the message says what to mend
                self.status, self.error = ERROR, str(exc)
                return None
            except Exception as exc:  # a bug: a failing lane reports and ends, the other lanes go on
                log.exception("lane %s failed", self.key)
                self.status, self.error = ERROR, f"{type(exc).__name__}: {exc} (details in the server log)"
                return None
            finally:
                self.seconds += time.perf_counter() - t0
        self.trace.steps.append(step)
        if self.on_step is not None:
            self.on_step(self.trace, step)
        if step.stop_reason is not None:
            self.status = DONE
            self.close()
        return step

    def stop(self) -> None:
        if not self.finished:
            self.status = STOPPED
        self.close()

    def close(self) -> None:
        if self.steps is not None and hasattr(self.steps, "close"):
            self.steps.close()
        self.steps = None


def replay_lane(trace: Trace) -> Lane:
    """A finished lane from a saved trace. Its time is the one the app recorded, else the sum of step timings."""
    own = trace.settings.lane_seconds
    if not own or own <= 0:
        own = sum(sum(s.timings.values()) for s in trace.steps)
    return Lane(lane_of(trace.method), trace, None, float(own), REPLAY)


def round_robin(lanes: list[Lane], stop: threading.Event | None = None,
                lock=None) -> Iterator[tuple[Lane, StepRecord | None]]:
    """Advance the unfinished lanes one step each, in turn, until all end or `stop` is set.

    Yields (lane, step) after every step (step is None when that lane just ended without one, e.g. an error).
    """
    while True:
        active = [lane for lane in lanes if not lane.finished]
        if not active:
            return
        for lane in active:
            if stop is not None and stop.is_set():
                for other in lanes:
                    other.stop()
                return
            step = lane.advance(lock)
            yield lane, step


def lane_stats(lane: Lane, baseline: Lane | None = None) -> list[tuple[str, str]]:
    """The numbers shown above a lane: tokens, tokens/s, tau, speedup over the baseline lane, elapsed time."""
    m = lane.metrics
    stats = [("tokens", str(lane.tokens)), ("tok/s", f"{lane.tokens_per_s:.1f}")]
    if lane.key != VANILLA:
        stats.append(("τ", f"{m.tau:.2f}" if m.verify_steps else "–"))
        if baseline is not None and baseline.tokens_per_s > 0 and lane.tokens_per_s > 0:
            stats.append(("speedup", f"{lane.tokens_per_s / baseline.tokens_per_s:.2f}×"))
        else:
            stats.append(("speedup", "–"))
    stats.append(("steps", str(len(lane.trace.steps))))
    stats.append(("time", f"{lane.seconds:.1f} s"))
    return stats


def step_ms(m) -> float:
    """A run's milliseconds a verify step, its phases summed (the prefill left out)."""
    return sum(m.phase_time.get(p, 0.0) for p in PHASES) / m.verify_steps * 1e3 if m.verify_steps else 0.0


def why_slower(plain, dart) -> str:
    """Where DART ran slower than plain decoding, why, from the two runs' own step times (Metrics); "" otherwise."""
    plain_ms, dart_ms = step_ms(plain), step_ms(dart)
    if not plain_ms or not dart_ms or dart.tokens_per_s >= plain.tokens_per_s:
        return ""
    drafting = (dart.phase_time.get("draft", 0.0) + dart.phase_time.get("search", 0.0)) / dart.verify_steps * 1e3
    verify = dart.phase_time.get("verify", 0.0) / dart.verify_steps * 1e3
    return (f"slower here because a DART step took {dart_ms / plain_ms:.2f}x a plain one ({dart_ms:.1f} ms: "
            f"{drafting:.1f} drafting and searching, {verify:.1f} verifying its tree; plain {plain_ms:.1f}) for "
            f"{dart.tau:.2f} tokens: a tree pays where its rows cost little more than one, as on a GPU")


def lane_status_text(lane: Lane) -> str:
    if lane.status in (DONE, REPLAY) and lane.trace.steps and lane.trace.steps[-1].stop_reason:
        reason = lane.trace.steps[-1].stop_reason
        return f"{lane.status} · {STOP_REASONS.get(reason, reason)}"
    if lane.status == ERROR:
        return f"error · {lane.error}"
    return lane.status
