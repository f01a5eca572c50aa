"""Which step of a lane the step view shows: the newest while following, the next one on Prev / Next, and, where the
user asks, past the steps that decoded plainly (the root verified alone: no draft tree to see). On a CPU where no
drafted tree pays, most of DART's steps are such (the automatic budget, docs/cpu-speed.md, sections 24 and 28); its
trees are then the steps worth seeing. A lane with no tree at all (plain decoding's) has nothing to skip to."""

from __future__ import annotations

from dart_core.trace import StepRecord, Trace


def plain_step(step: StepRecord) -> bool:
    """A step that decoded plainly: a verify of the root alone (the prefill is a step of its own kind)."""
    return step.kind != "prefill" and not step.drafted


def _skips(trace: Trace, skip_plain: bool) -> bool:
    return skip_plain and any(step.drafted for step in trace.steps)


def newest(trace: Trace, skip_plain: bool) -> int:
    """The newest step, or the newest that is not plain."""
    last = len(trace.steps) - 1
    if not _skips(trace, skip_plain):
        return last
    return next(i for i in range(last, -1, -1) if not plain_step(trace.steps[i]))


def moved(trace: Trace, index: int, delta: int, skip_plain: bool) -> int:
    """The step `delta` (+1 or -1) from `index`, or the nearest one that way that is not plain (`index` where none
    is); may run past either end (the view clamps it)."""
    if not _skips(trace, skip_plain):
        return index + delta
    i = index + delta
    while 0 <= i < len(trace.steps):
        if not plain_step(trace.steps[i]):
            return i
        i += delta
    return index
