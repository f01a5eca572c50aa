"""What the app process holds right now, for the `/health` API and the soak script (scripts/soak.py): the sessions
and their folders, Gradio's own per-page data and file cache, and the process's resident memory."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from .session import SessionStore


def rss_bytes() -> int:
    """The process's resident set size (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def trim_malloc() -> bool:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim; False where there is no glibc). Freed
    sessions leave their large buffers (figure JSON, traces) in malloc's arenas, which Python does not return."""
    name = ctypes.util.find_library("c")
    try:
        return bool(ctypes.CDLL(name).malloc_trim(0)) if name else False
    except (OSError, AttributeError):
        return False


def bytes_under(folder: Path | str | None) -> int:
    """Bytes of the files under `folder` (0 if it does not exist); files removed meanwhile are skipped."""
    total = 0
    for root, _, files in os.walk(folder or ""):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def health(sessions: SessionStore, trace_dir: Path, gradio_cache: str | None, gradio_pages: int) -> dict:
    """One snapshot: `sessions` (held, running, their folders and bytes, how many were freed and why), the bytes
    under the trace folder and Gradio's file cache, Gradio's pages with state, and the RSS."""
    folders = sum(1 for p in trace_dir.iterdir() if p.is_dir()) if trace_dir.is_dir() else 0
    return {**sessions.stats(), "trace_dir_folders": folders, "trace_dir_bytes": bytes_under(trace_dir),
            "gradio_cache_bytes": bytes_under(gradio_cache), "gradio_pages": gradio_pages, "rss_bytes": rss_bytes()}
