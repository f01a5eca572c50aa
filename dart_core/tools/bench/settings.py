"""What a resumed benchmark must share with the runs it continues, and the check that it does."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import transformers

from ...setup.defaults import DEFAULT_HEAD
from ..args import CliError
from .plan import BenchPlan


def resume_settings(plan: BenchPlan) -> dict:
    """Everything that changes outputs or speed. Methods, dtypes, temperatures and prompts may differ: runs are
    matched one by one."""
    return {"model": plan.model, "draft": plan.draft, "ngram": plan.ngram, "device": plan.device,
            "max_new_tokens": plan.max_new_tokens, "top_p": plan.top_p, "top_k": plan.top_k, "seed": plan.seed,
            "pld_tokens": plan.pld_tokens, "pld_ngram": plan.pld_ngram, "lookup_tokens": plan.lookup_tokens,
            "ngram_context_weight": plan.ngram_context_weight, "search": plan.search.to_dict(),
            **({"auto_budget": True} if plan.auto_budget else {}),   # absent: the fixed budget of older runs files
            # absent: dart_pld's branch had its default length even with the automatic budget (older runs files)
            **({"lookup_chosen": True} if plan.auto_budget and plan.lookup_tokens is None else {}),
            "draft_kernels": plan.draft_kernels,
            **({"thinking": True} if plan.thinking else {}),         # absent: off, as in older runs files
            **({"candidates": "not recorded"} if not plan.record_candidates else {}),   # absent: recorded
            "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
            # a head or table rebuilt in place keeps its name: compare the bytes
            "draft_sha256": files_digest(DEFAULT_HEAD if plan.draft == "default" else plan.draft),
            "ngram_sha256": files_digest(plan.ngram)}


def files_digest(path) -> str | None:
    """sha256 over a file or a folder's files; None for a name that is no path ('random', 'none', 'default')."""
    if not path or str(path) in ("none", "random", "default"):
        return None
    path = Path(path)
    if not path.exists():
        return None
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(path).as_posix().encode() if f != path else b"")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def check_settings(old: dict, new: dict, path) -> None:
    """Resuming under other settings would mix runs that do not compare: name the first setting that differs."""
    old, new = _flat(old), _flat(json.loads(json.dumps(new)))     # compare as read back (tuples become lists)
    for key in dict.fromkeys([*new, *old]):
        if old.get(key) != new.get(key):
            raise CliError(f"cannot resume {path}: its runs have {key}={old.get(key)!r}, this run "
                           f"{key}={new.get(key)!r} (use the same settings, or drop --resume to start afresh)")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
