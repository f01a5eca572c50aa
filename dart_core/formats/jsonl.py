"""JSON Lines files (one JSON value a line; gzipped where the name ends in .gz): the one reader of them, with one
rule for a bad line, and the one way to append to them.

The rule: a line that is not JSON is skipped and counted by its line number; reading goes on past it and never fails
on it. Blank lines are not records and are not counted. The count is always told: `read_jsonl` warns on stderr
naming the file and the lines, and readers with a report of their own (the bench's prompt file, the n-gram
table's sources, the bench's runs file) list them there.

Why skip and count, rather than stop at the line or fail: most of these files are written a record a line by long
runs (the target answering thousands of prompts for training, a bench of hundreds of runs), flushed as they go. A
run killed mid-write leaves its last line cut, and a run resumed before `append_jsonl` existed wrote its records
after that line. Failing on it would refuse a file of hours of good records until someone mends it by hand;
stopping at it (training's reader did) dropped without a word every good record after it, so each resumed run
answered those prompts again. Skipping keeps every complete record and loses only the one whose write was cut,
which a resumed run redoes. A line that is JSON but not the record a reader needs (a missing field) is that
reader's to judge: the chats file refuses one before training starts, the bench's prompt file skips it.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO


class JsonLines:
    """A JSON Lines file read line by line. Iterating gives (line number, value) for each line that is JSON;
    `bad_lines` then holds the numbers of the lines skipped as not JSON (complete once iterated to the end)."""

    def __init__(self, path):
        self.path = Path(path)
        self.bad_lines: list[int] = []

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        self.bad_lines = []
        with _open_text(self.path) as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError:
                    self.bad_lines.append(number)
                    continue
                yield number, value

    def values(self) -> list:
        """Every value of the file, in order (bad lines skipped and counted)."""
        return [value for _, value in self]

    def skipped(self) -> str | None:
        """What was skipped, for a warning: 'FILE: skipped 2 lines that are not JSON (lines 4, 9)'; None if none."""
        if not self.bad_lines:
            return None
        shown = ", ".join(map(str, self.bad_lines[:10])) + (", ..." if len(self.bad_lines) > 10 else "")
        return f"{self.path}: skipped {len(self.bad_lines)} line(s) that are not JSON (line {shown})"


def read_jsonl(path) -> list:
    """The values of a JSON Lines file; lines that are not JSON are skipped and named in a warning on stderr."""
    lines = JsonLines(path)
    values = lines.values()
    warn_skipped(lines)
    return values


def warn_skipped(lines: JsonLines) -> None:
    if lines.skipped():
        print(f"[dart] {lines.skipped()}", file=sys.stderr, flush=True)


def write_jsonl(path, records) -> None:
    """Records one per line, gzipped where the name ends in .gz (token ids: about 2 bytes each so), written whole
    (to a temporary file first: a stop mid-write leaves the old file)."""
    text = "".join(json.dumps(r) + "\n" for r in records)
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(gzip.compress(text.encode(), mtime=0) if p.suffix == ".gz" else text.encode())
    tmp.replace(p)


def append_jsonl(path) -> TextIO:
    """`path` opened to append records, each on a line of its own: a last line cut by a stopped run (no newline, not
    JSON) is cut off first, a last record that only lacks its newline gets it. Plain (not gzipped) files only."""
    p = Path(path)
    if p.is_file():
        data = p.read_bytes()
        tail = data[data.rfind(b"\n") + 1:]
        if tail.strip():
            try:
                json.loads(tail)
                p.write_bytes(data + b"\n")
            except ValueError:      # the record being written when the run stopped: it is redone
                p.write_bytes(data[: len(data) - len(tail)])
    return open(p, "a", encoding="utf-8")


def _open_text(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")
