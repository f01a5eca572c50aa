"""The bench's prompts: loading the workloads and a prompt file, what makes a prompt the same one in a later
session, and skipping a prompt (counted in its workload's summary)."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ...setup.datasets import WORKLOADS, read_prompt_file
from ..args import CliError

ALL = "all"                                # the workload that sums all the others in the report
IDENT_KEYS = ("workload", "index", "id", "raw", "sha256")


@dataclass
class BenchPrompt:
    id: str
    workload: str
    text: str
    raw: bool = False
    ids: list[int] = field(default_factory=list)
    index: int = 0                         # position in its workload (before --limit cuts it)


def load_prompts(workloads: list[str], prompt_file: str | None, limit: int | None) -> tuple[list[BenchPrompt], dict]:
    """Prompts of each workload (at most `limit` each), and a per-workload summary (counts, skipped lines)."""

    prompts: list[BenchPrompt] = []
    info: dict[str, dict] = {}
    for name in workloads:
        if name not in WORKLOADS:
            raise CliError(f"unknown workload {name!r}; use a comma list of {', '.join(WORKLOADS)}")
        items = WORKLOADS[name]()[:limit]
        prompts += [BenchPrompt(p.id, name, p.text, p.raw, index=i) for i, p in enumerate(items)]
        info[name] = {"prompts": len(items), "skipped": 0}
    if prompt_file:
        pf = read_prompt_file(prompt_file)
        name = Path(prompt_file).stem or "prompts"
        if name in info or name == ALL:
            name = f"file:{name}"
        items = pf.prompts[:limit]
        prompts += [BenchPrompt(p.id, name, p.text, p.raw, index=i) for i, p in enumerate(items)]
        info[name] = {"prompts": len(items), "skipped": len(pf.skipped), "skipped_reasons": pf.skipped[:50],
                      "file": str(prompt_file)}
        if pf.skipped:
            print(f"[bench] {prompt_file}: skipped {len(pf.skipped)} bad line(s), e.g. {pf.skipped[0]}",
                  file=sys.stderr)
    return prompts, info


def prompt_ident(p: BenchPrompt) -> dict:
    """What makes a prompt the same one in a later session: workload, place and id, and its exact text."""
    return {"workload": p.workload, "index": p.index, "id": p.id, "raw": p.raw,
            "sha256": hashlib.sha256(p.text.encode("utf-8")).hexdigest()[:16]}


def ident_tuple(ident: dict) -> tuple:
    return tuple(ident[k] for k in IDENT_KEYS)


def skip_prompt(info: dict, prompt: BenchPrompt, reason: str) -> None:
    """Count `prompt` as skipped in its workload's summary `info`, with the reason."""
    w = info[prompt.workload]
    w["prompts"] -= 1
    w["skipped"] = w.get("skipped", 0) + 1
    w.setdefault("skipped_reasons", []).append(reason)
    print(f"[bench] skipped {reason}", file=sys.stderr)
