"""A recorded trace replayed step by step: each step that drafted, with its context and what the target said after its
root (the tokens the run committed next: exact for greedy runs, the sampled tokens otherwise). The forensics, the
what-if and studies/tune_search.py read a step's outcome under other knobs off it (with dart_core.budget.pool's `CandidatePool`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..trace import StepRecord, Trace


@dataclass
class ReplayStep:
    """A recorded step with what the target said after its root."""
    index: int
    step: StepRecord
    context: list[int]          # the committed tokens, ending with the step's root
    future: list[int]           # the target's tokens after the root (as many as were asked for and recorded)


def replay_steps(trace: Trace, ahead: int | None = None, whole: bool = False) -> Iterator[ReplayStep]:
    """The steps that drafted (their draft rows recorded), in order, each with its context and the tokens the run
    committed after its root. `ahead`: as many of those as the step's rows or `ahead`, whichever is more (None: all
    of them); `whole`: only the steps the run went on long enough after to cover their rows."""
    output = trace.output_ids
    start = 0
    for i, s in enumerate(trace.steps):
        if s.rows_tokens is not None and len(s.rows_tokens):
            future = output[start:] if ahead is None else output[start: start + max(len(s.rows_tokens), ahead)]
            if not whole or len(future) >= len(s.rows_tokens):
                yield ReplayStep(i, s, list(trace.prompt_ids) + output[:start], future)
        start += len(s.new_tokens)


def replay_step(trace: Trace, index: int) -> ReplayStep:
    """Step `index` with its context and every token the run committed after its root."""
    start = sum(len(s.new_tokens) for s in trace.steps[:index])
    output = trace.output_ids
    return ReplayStep(index, trace.steps[index], list(trace.prompt_ids) + output[:start], output[start:])
