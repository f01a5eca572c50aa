"""Fixtures shared by the test modules, and the lines that say which capability-gated kernels this run used."""

import pytest
import torch

from dart_core.hardware import detect
from tests.app_fixtures import big_search_trace, hand_trace, tiny_traces

# The CPU paths the engine takes only where a capability exists. `capable` turns them all on: real kernels where this
# CPU has them, stand-ins (dart_core.kernels.STAND_IN_OPS) where it does not, so every path runs on every machine.
GATED = ("onednn", "onednn_bf16")
_used_by: list[str] = []
_reported: list[str] = []    # measurements that tests report (not assert on), shown at the end of the run


def gated_paths() -> str:
    hw = detect().with_stand_ins(*GATED)
    return ", ".join(f"{c} {'stand-in' if c in hw.stand_ins else 'real'}" for c in GATED)


def pytest_report_header(config):
    hw = detect()
    limited = f" · limited by {hw.limits}" if hw.limits else ""
    return [f"CPU: {hw.name} · kind {hw.kind}{limited} · torch capability {hw.capability} · {hw.threads} threads",
            f"capability-gated kernels in this run: {gated_paths()}"]


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(pytest_report_header(None)[0])   # under -q too: which CPU kind these results are from
    for line in _reported:
        terminalreporter.write_line(line)
    if _used_by:
        terminalreporter.write_line(f"capability-gated kernels ({gated_paths()}) ran in {len(_used_by)} tests "
                                    f"through the `capable` fixture")


@pytest.fixture
def capable(request):
    """This machine with every capability-gated CPU path on (see GATED)."""
    _used_by.append(request.node.nodeid)
    return detect().with_stand_ins(*GATED)


@pytest.fixture
def one_thread():
    """Many one-row forwards of a tiny model: more threads only add overhead (far more with other processes on
    the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hand():
    """The hand-built trace with known answers (tests/app_fixtures.hand_trace)."""
    return hand_trace()


@pytest.fixture(scope="module")
def tiny():
    """Real traces of every method from a tiny model (tests/app_fixtures.tiny_traces)."""
    return tiny_traces()


@pytest.fixture(scope="module")
def big():
    """One step with a default-size candidate pool (tests/app_fixtures.big_search_trace)."""
    return big_search_trace()


@pytest.fixture
def report(request):
    """report(text): a line for the end of the test run (a number worth reading that no assertion bounds)."""
    return lambda text: _reported.append(f"{request.node.name}: {text}")
