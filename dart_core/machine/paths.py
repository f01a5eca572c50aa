"""Where the engine keeps what it derives on a machine (model copies, n-gram tables, measurements, built kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """DART_CACHE_DIR, else $XDG_CACHE_HOME/dart-lab, else ~/.cache/dart-lab."""
    base = os.environ.get("DART_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dart-lab")
    return Path(base)
