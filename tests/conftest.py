"""Fixtures shared by the test modules."""

import pytest
import torch

from tests.app_fixtures import big_search_trace, hand_trace, tiny_traces


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
