"""Large buffers that the C layer streams (packed weights, the output layer's copy and tiles), on transparent huge
pages where Linux offers them.

A one-row forward reads every weight once. On 4 KB pages the 425 MB of SmolLM2-135M's decoder linears span about
100,000 pages, far more than the TLB holds, and every page's first read waits on a page-table walk. On 2 MB pages
the same read went faster on the AMX Xeon (docs/cpu-speed.md, section 13): the model's linears 14.71 -> 13.62 ms for
one row, 16.96 -> 14.63 ms for nine, the same bits.

Linux backs an anonymous mapping with huge pages where asked (madvise) when its transparent huge pages are "always"
or "madvise"; elsewhere (another OS, "never", an mmap without MADV_HUGEPAGE) buffers are torch's own, and everything
computes the same. Only the whole 2 MB pages of a buffer are asked for: its last partial page stays on small pages,
so no buffer takes more memory than its size.
"""

from __future__ import annotations

import functools
import mmap
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@functools.cache
def offered() -> bool:
    """Whether this OS backs memory asked for with huge pages (Linux's transparent huge pages, not "never")."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        setting = THP_SETTING.read_text()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


_enabled = True


def use(enabled: bool) -> bool:
    """Turn huge pages on or off for buffers made from now on (a comparison, a test); returns the previous state."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


def in_use() -> bool:
    return _enabled and offered()


def empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized contiguous CPU tensor, its whole 2 MB pages huge where offered (torch.empty otherwise and for
    buffers under one huge page)."""
    size = torch.Size([shape] if isinstance(shape, int) else shape)
    nbytes = size.numel() * dtype.itemsize
    if nbytes < HUGE_PAGE or not in_use():
        return torch.empty(size, dtype=dtype)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(region, dtype=torch.uint8)   # holds `region`: the mapping lives as long as a view of it
    start = -whole.data_ptr() % HUGE_PAGE
    try:
        region.madvise(mmap.MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    except OSError:
        pass   # refused (a kernel without it): small pages, the same tensor
    return whole[start: start + nbytes].view(dtype).view(size)


def copy_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `t` (a CPU tensor) in a buffer from `empty`."""
    out = empty(t.shape, t.dtype)
    out.copy_(t)
    return out
