"""Output files: checked before any long work starts, written so that no half-written file is ever seen."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import DartError


class OutputPathError(DartError):
    """An output path that cannot be written."""


def check_writable(path) -> Path:
    """Fail fast (before a minutes-long decode or build) when `path` cannot be written; returns it as a Path."""
    out = Path(path)
    if out.is_dir():
        raise OutputPathError(f"cannot write the output to {out}: it is a folder")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".write-test-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise OutputPathError(f"cannot write the output to {out}: {reason} ({parent})") from None
    return out


def write_atomic(path, write) -> int:
    """Call write(tmp_path) on a temporary file in the same folder, then rename it to `path`. Returns the size."""
    out = Path(path)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out.stat().st_size
