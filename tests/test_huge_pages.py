"""Buffers on transparent huge pages (dart_core/machine/huge_pages.py): where Linux offers them, the C layer's packed
weights are asked for on 2 MB pages; the values and every product are the same either way."""

import gc
from pathlib import Path

import pytest
import torch

from dart_core.machine import few_rows, huge_pages
from dart_core.machine.hardware import kernels_here

MB = 1 << 20


def mapping_of(t: torch.Tensor) -> dict[str, str]:
    """The fields of /proc/self/smaps for the mapping that holds t's first byte."""
    address, fields, inside = t.data_ptr(), {}, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(a, 16) for a in head.split("-"))
            if inside:
                break
            inside = lo <= address < hi
        elif inside:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


@pytest.fixture
def switch():
    previous = huge_pages.use(True)
    yield
    huge_pages.use(previous)


def test_a_large_buffer_is_asked_for_on_huge_pages_where_they_are_offered(switch):
    t = huge_pages.empty((5 * MB + 12345,), torch.uint8)
    assert t.shape == (5 * MB + 12345,) and t.is_contiguous() and t.dtype == torch.uint8
    t.fill_(7)
    assert int(t[-1]) == 7 and int(t.sum()) == 7 * t.numel()
    if not huge_pages.offered():
        return   # this OS offers none: torch's own buffer (checked below)
    assert t.data_ptr() % huge_pages.HUGE_PAGE == 0
    fields = mapping_of(t)
    assert fields.get("THPeligible") == "1", fields


def test_small_buffers_and_switched_off_ones_are_torchs_own(switch):
    """torch.empty's own buffers (no view of a mapping of ours). Whether a mapping of torch's is eligible for huge
    pages is the allocator's business: its heap may hold memory another part of the process asked huge pages for."""
    small = huge_pages.empty((3, 5), torch.float32)
    assert small.shape == (3, 5) and small.dtype == torch.float32 and small._base is None
    huge_pages.use(False)
    off = huge_pages.empty((4 * MB,), torch.float32)
    assert not huge_pages.in_use() and off._base is None
    if huge_pages.offered():
        huge_pages.use(True)
        assert huge_pages.empty((4 * MB,), torch.float32)._base is not None   # switched on: a view of its mapping


def test_not_offered_where_the_os_says_never(monkeypatch, tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "THP_SETTING", setting)
    huge_pages.offered.cache_clear()
    try:
        assert not huge_pages.offered() and not huge_pages.in_use()
        t = huge_pages.empty((3 * MB,), torch.int8)
        assert t.shape == (3 * MB,)
    finally:
        huge_pages.offered.cache_clear()


def test_the_buffer_lives_as_long_as_a_view_of_it(switch):
    view = huge_pages.copy_of(torch.arange(MB, dtype=torch.float32))[10:20]
    gc.collect()
    junk = [torch.empty(MB) for _ in range(8)]   # memory handed out again would show in the view
    for j in junk:
        j.fill_(-1.0)
    assert torch.equal(view, torch.arange(10, 20, dtype=torch.float32))


def test_packed_weights_and_their_products_are_the_same_on_either_pages(switch):
    kernel = kernels_here()
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(4000, 576, generator=gen), torch.randn(9, 576, generator=gen)   # int8: 2.3 MB
    for dtype in few_rows.WEIGHT_KINDS:
        huge_pages.use(True)
        on = kernel.pack(weight, dtype)
        huge_pages.use(False)
        off = kernel.pack(weight, dtype)
        assert torch.equal(on.blocks, off.blocks), dtype
        assert (on.scales is None) == (off.scales is None)
        if on.scales is not None:
            assert torch.equal(on.scales, off.scales)
        if huge_pages.offered():
            assert on.blocks.data_ptr() % huge_pages.HUGE_PAGE == 0
        if kernel is not None:
            assert torch.equal(kernel.linear(x, on, None), kernel.linear(x, off, None)), dtype
