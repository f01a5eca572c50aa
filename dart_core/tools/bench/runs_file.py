"""The runs file, which lets a stopped benchmark resume.

Each finished run is appended as one JSON line to `<out>.runs.jsonl` next to the report (the runs file, flushed line
by line; its first line holds the settings that change outputs or speed). `--resume` reads it back: runs found there
are not run again, a dtype with nothing left is not even loaded, and the report is built from the old and new runs
together. Resuming with other settings is an error; without --resume the runs file starts afresh.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from ...formats.jsonl import JsonLines, append_jsonl
from ...metrics import Metrics
from ..args import CliError
from .prompts import BenchPrompt, ident_tuple, prompt_ident, skip_prompt
from .runs import Run, key_of
from .settings import check_settings

RUNS_FORMAT = "dart-lab-bench-runs/1"


def runs_path(out_path) -> Path:
    """The runs file next to the report: runs/bench.json -> runs/bench.runs.jsonl."""
    return Path(out_path).with_suffix(".runs.jsonl")


def run_to_dict(run: Run) -> dict:
    """A run as one runs-file record. Its reference and first difference are left out: they are derived from all
    the runs of its prompt when the report is built."""
    return {"prompt": {**prompt_ident(run.prompt), "ids": list(run.prompt.ids)}, "method": run.method,
            "dtype": run.dtype, "temperature": run.temperature, "seed": run.seed, "output": list(run.output),
            "seconds": run.seconds, "calibration_seconds": run.calibration_seconds, "forwards": run.forwards,
            "stop": run.stop,
            "metrics": None if run.metrics is None else asdict(run.metrics)}


def run_from_dict(d: dict, prompt: BenchPrompt) -> Run:
    """The run of a runs-file record, attached to `prompt` (the same prompt of this session)."""
    m = d["metrics"]
    # A record saved before Metrics counted prefills lacks the count: a run is one generation, one prefill.
    metrics = None if m is None else Metrics(**{"prefills": 1, **m})
    return Run(prompt, d["method"], d["dtype"], d["temperature"], list(d["output"]), d["seconds"],
               forwards=d["forwards"], metrics=metrics, stop=d["stop"], seed=d["seed"],
               calibration_seconds=d.get("calibration_seconds", 0.0))     # absent from older records: none


class RunsFile:
    """The runs file: a header line {"format", "settings"}, then a {"run": ...} line per finished run and a
    {"skip": ..., "reason": ...} line per prompt too long for the model, each flushed as it is written, so that a
    killed benchmark loses at most the run in progress. Closes on leaving a `with` block."""

    def __init__(self, path: Path, settings: dict, resume: bool):
        self.path, self.runs, self.skips = Path(path), [], []
        if not (resume and self.path.is_file() and self._read(settings)):
            self._start(settings, resume)
        self.fh = append_jsonl(self.path)      # a record cut by a kill is dropped: its run is redone

    def _start(self, settings: dict, resume: bool) -> None:
        if self.path.exists() and not resume:
            print(f"[bench] replacing {self.path} (--resume would have continued it)", file=sys.stderr)
        elif resume:
            print(f"[bench] nothing to resume in {self.path}: starting", file=sys.stderr)
        _write_atomic(self.path, [json.dumps({"format": RUNS_FORMAT, "settings": settings})])

    def _read(self, settings: dict) -> bool:
        """Load the records of an earlier session; False when the file holds none (start afresh)."""
        lines = JsonLines(self.path)
        good = lines.values()
        if not good:
            return False
        header = good[0]
        if not isinstance(header, dict) or header.get("format") != RUNS_FORMAT:
            raise CliError(f"cannot resume {self.path}: not a bench runs file ({RUNS_FORMAT})")
        check_settings(header.get("settings", {}), settings, self.path)
        for rec in good[1:]:
            if not isinstance(rec, dict):
                continue
            if "run" in rec:
                self.runs.append(rec["run"])
            elif "skip" in rec:
                self.skips.append(rec)
        if lines.bad_lines:          # the last line of a killed run, cut short: kept out of the file from now on
            print(f"[bench] {self.path}: ignored {len(lines.bad_lines)} unreadable line(s) (line "
                  f"{', '.join(map(str, lines.bad_lines))}); that run is redone", file=sys.stderr)
            _write_atomic(self.path, [json.dumps(rec) for rec in good])
        return True

    def add_run(self, run: Run) -> None:
        self._append({"run": run_to_dict(run)})

    def add_skip(self, prompt: BenchPrompt, reason: str) -> None:
        self._append({"skip": prompt_ident(prompt), "reason": reason})

    def _append(self, record: dict) -> None:
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()

    def __enter__(self) -> "RunsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write_atomic(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def restore(runs_file: RunsFile, prompts: list[BenchPrompt], workload_info: dict):
    """This session's prompts less those the runs file skipped, and its runs of them keyed by run_key (runs of
    other prompts are ignored)."""
    by_ident = {ident_tuple(prompt_ident(p)): p for p in prompts}
    skipped = set()
    for rec in runs_file.skips:
        ident = ident_tuple(rec["skip"])
        if ident in by_ident and ident not in skipped:
            skipped.add(ident)
            skip_prompt(workload_info, by_ident[ident], rec["reason"])
    done: dict[tuple, Run] = {}
    for d in runs_file.runs:
        p = by_ident.get(ident_tuple(d["prompt"]))
        if p is None:
            continue
        if not p.ids:
            p.ids = list(d["prompt"]["ids"])      # a dtype that is all done is not loaded to tokenize
        run = run_from_dict(d, p)
        done[key_of(run)] = run
    kept = [p for p in prompts if ident_tuple(prompt_ident(p)) not in skipped]
    return kept, done
