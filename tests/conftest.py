"""Fixtures shared by the test modules, and the lines that say which capability-gated kernels this run used."""

import pytest
import torch

from dart_core.machine.hardware import detect
from tests.app_fixtures import big_search_trace, hand_trace, tiny_traces

# The CPU paths the engine takes only where a capability exists. `capable` turns them all on: real kernels where this
# CPU has them, stand-ins (dart_core.machine.kernels.STAND_IN_OPS) where it does not, so every path runs on every
# machine.
GATED = ("onednn", "onednn_bf16", "few_rows")
_used_by: list[str] = []
_reported: list[str] = []    # measurements that tests report (not assert on), shown at the end of the run


def gated_paths() -> str:
    hw = detect().with_stand_ins(*GATED)
    return ", ".join(f"{c} {'stand-in' if c in hw.stand_ins else 'real'}" for c in GATED)


def cpu_line() -> str:
    """Which CPU, of which kind, these results are from: the test run's first and last lines."""
    hw = detect()
    limited = f" · limited by {hw.limits}" if hw.limits else ""
    return f"CPU: {hw.name} · kind {hw.kind}{limited} · torch capability {hw.capability} · {hw.threads} threads"


def pytest_report_header(config):
    return [cpu_line(), f"capability-gated kernels in this run: {gated_paths()}"]


def _terminal(config):
    return config.pluginmanager.get_plugin("terminalreporter")


def pytest_sessionstart(session):
    terminal = _terminal(session.config)
    if terminal is not None and session.config.get_verbosity() < 0:   # -q hides the report header: say it first
        terminal.write_line(cpu_line())


def pytest_terminal_summary(terminalreporter):
    for line in _reported:
        terminalreporter.write_line(line)
    if _used_by:
        terminalreporter.write_line(f"capability-gated kernels ({gated_paths()}) ran in {len(_used_by)} tests "
                                    f"through the `capable` fixture")


def pytest_unconfigure(config):
    terminal = _terminal(config)
    if terminal is not None:        # after the counts of passed and failed: the run's last line, under -q too
        terminal.write_line(cpu_line())


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
def default_model_once():
    """For a test module that loads the default model many times (CLI calls, bench sessions): each load of it with
    the same device, dtype and threads (the kernels are measured per thread count) after the first hands back the
    target loaded then, for the rest of the module. Loading it reads 0.5 GB and packs its kernels (2-3 s a time on
    2 cores); nothing a run does changes a target. The CLI, the app and the bench still ask to load it as before
    (tests that count or forbid loads wrap these names themselves); other models, other hardware and
    --recalibrate load as usual."""
    from dart_core.setup import loading
    from dart_core.tools.bench import loop as bench_loop

    real = loading.load_target
    targets = {}

    def load_target(model=loading.DEFAULT_MODEL, device="cpu", dtype="auto", recalibrate=False, hardware=None,
                    **kwargs):
        if model != loading.DEFAULT_MODEL or recalibrate or hardware is not None or kwargs:
            return real(model, device, dtype, recalibrate, hardware, **kwargs)
        key = (device, dtype, torch.get_num_threads())
        if key not in targets:
            targets[key] = real(model, device, dtype)
        return targets[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loading, "load_target", load_target)       # what load() calls: the CLI's generate, the app
        mp.setattr(bench_loop, "load_target", load_target)    # the bench's own import
        yield targets
    targets.clear()


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
