"""Phase timings of a decoding step that cost the loop no synchronisation of their own.

On a CPU a mark is `perf_counter`. On CUDA the work is queued, so host clocks would time the launches: a mark is a
CUDA event recorded on the current stream, and the spans are read once the step has synchronised anyway (the
acceptance reads the target's choices back), so timing adds no host-device sync.
"""

from __future__ import annotations

import time

import torch


class PhaseClock:
    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self._marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def spans(self) -> list[float]:
        """Seconds between consecutive marks; the marks are cleared for the next step."""
        marks, self._marks = self._marks, []
        if self.cuda:
            marks[-1].synchronize()
            return [a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:])]
        return [b - a for a, b in zip(marks, marks[1:])]
