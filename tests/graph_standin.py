"""CUDA graph capture played on the CPU, for the tests of the steps a GPU captures (tests/test_lean_forward.py,
tests/test_draft_fixed.py): the capture's outputs are the graph's, each replay fills them again from the inputs the
capture read, and a captured step may hold only what a CUDA graph can capture."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

from dart_core import fixed_step
from tests.device_reads import reads_on_host


class CapturableOnly(TorchDispatchMode):
    """Refuses the operations a CUDA graph cannot capture: those that read a value on the host (a tensor's item or
    truth, a boolean mask's indices, unique values: tests/device_reads.py) and tensors made from host data (copied to
    the device as the capture runs). Any of them in a captured step fails its capture on a GPU."""
    FROM_HOST = {"aten.lift_fresh", "aten.lift_fresh_copy"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if reads_on_host(func, args) or str(func.overloadpacket) in self.FROM_HOST:
            raise AssertionError(f"{func} in a captured step: a CUDA graph cannot capture it")
        return func(*args, **(kwargs or {}))


class ReplayedOnTheCpu:
    """What a captured CUDA graph does, on the CPU: the outputs of the capture are the graph's, and each replay
    fills those same tensors again from the inputs the capture read (here by running the step again). The capture
    runs only what a CUDA graph can capture."""
    def __init__(self, fn):
        self.fn, self.replays = fn, 0
        with CapturableOnly():
            self.outputs = fn()

    def replay(self):
        self.replays += 1
        for mine, again in zip(self.outputs, self.fn()):
            if mine is not None:
                mine.copy_(again)


def play_captures(monkeypatch) -> list[ReplayedOnTheCpu]:
    """Every capture from now on played on the CPU; returns the list they are added to."""
    graphs = []

    def capture(fn):
        graphs.append(ReplayedOnTheCpu(fn))
        return graphs[-1], graphs[-1].outputs
    monkeypatch.setattr(fixed_step, "capture_graph", capture)
    return graphs
