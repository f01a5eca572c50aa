"""The CPU's name and feature flags, as the operating system reports them (read once)."""

from __future__ import annotations

import platform
from functools import lru_cache


def _cpuinfo(field: str) -> str | None:
    """The value of the first `field` line of /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo has none)."""
    return frozenset((_cpuinfo("flags") or "").split())


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, platform elsewhere)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()
