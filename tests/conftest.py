"""Fixtures shared by the test modules."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Many one-row forwards of a tiny model: more threads only add overhead (far more with other processes on
    the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
