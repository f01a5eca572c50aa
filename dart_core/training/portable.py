"""Training data as token ids, for a machine that has the target but not the data packages (a GPU machine
that reaches no registry and takes at most 64 MiB a run): `train-data export` writes, into one folder,

    heldout.jsonl      the fixed held-out set (`train --heldout-set fixed`) as records: `train --heldout-file`
    text.jsonl.gz      ShareGPT conversations as written and standard-library code, as records: `train --responses`
    prompts.jsonl.gz   ShareGPT first user turns, for `train-data generate --prompts` (the target's own answers)
    export.json        what was written, with the tokenizer and the Python whose standard library gave the code

A record is {"id", "prompt_ids", "response_ids"}, as `train-data generate` writes them; a prompt has no
"response_ids". None of them holds a text of the held-out set: its sources are left out of the other two files.
The held-out set travels as a file because the machine that reads it may have another Python (another standard
library, so other code functions) or no ShareGPT package at all; a learning curve compares runs only on one set.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

from ..formats.jsonl import JsonLines, warn_skipped, write_jsonl
from .data import fixed_heldout, same_source, sharegpt_prompts, sharegpt_sequences, stdlib_code_sequences

HELDOUT, TEXT, PROMPTS, MANIFEST = "heldout.jsonl", "text.jsonl.gz", "prompts.jsonl.gz", "export.json"


class PortableDataError(ValueError):
    """A data file that cannot be used: the message names the file and what is wrong."""


def export(tokenizer, out: Path, sharegpt: int, code: int, prompts: int, max_tokens: int, seed: int,
           thinking: bool = False, max_prompt_tokens: int = 192) -> dict:
    """Write the folder described above; returns what export.json records."""
    out.mkdir(parents=True, exist_ok=True)
    heldout = fixed_heldout(tokenizer, max_tokens, thinking=thinking)
    kept_out = {same_source(r["id"]) for r in heldout}
    # the prompts' fixed order is sharegpt_prompts' (so --skip means the same on every machine); held-out ones out
    asked = [(pid, ids) for pid, ids in sharegpt_prompts(tokenizer, prompts + len(heldout), max_prompt_tokens, seed)
             if pid not in kept_out][:prompts] if prompts else []
    # conversations as written: neither held out nor among the prompts (the target answers those: other texts)
    skip = kept_out | {pid for pid, _ in asked}
    text = sharegpt_sequences(tokenizer, skip, sharegpt, max_tokens, seed, thinking) if sharegpt else []
    text += stdlib_code_sequences(tokenizer, code, max_tokens, thinking=thinking) if code else []
    text = [r for r in text if same_source(r["id"]) not in kept_out]
    write_jsonl(out / HELDOUT, heldout)
    write_jsonl(out / TEXT, text)
    write_jsonl(out / PROMPTS, [{"id": pid, "prompt_ids": ids} for pid, ids in asked])
    manifest = {"heldout": len(heldout), "text": len(text), "prompts": len(asked),
                "tokens": sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in heldout + text)
                + sum(len(ids) for _, ids in asked),
                "tokenizer": getattr(tokenizer, "name_or_path", ""), "vocab_size": len(tokenizer),
                "max_tokens": max_tokens, "seed": seed, "thinking": thinking,
                "python": platform.python_version(), "bytes": {}}
    manifest["bytes"] = {name: (out / name).stat().st_size for name in (HELDOUT, TEXT, PROMPTS)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_records(path, vocab_size: int, need_response: bool = True) -> list[dict]:
    """The records of a file written by export (or by `train-data generate`), checked: every one has an id and
    token ids inside the target's vocabulary (a file made for another tokenizer fails here, in one line)."""
    p = Path(path)
    if not p.is_file():
        raise PortableDataError(f"{p}: no such file")
    lines = JsonLines(p)
    numbered = list(lines)
    warn_skipped(lines)
    if not numbered:
        raise PortableDataError(f"{p}: no records")
    fields = ("prompt_ids", "response_ids") if need_response else ("prompt_ids",)
    for n, r in numbered:
        if not isinstance(r, dict) or "id" not in r or any(not isinstance(r.get(f), list) for f in fields):
            raise PortableDataError(f"{p}:{n}: a record needs an id and the lists {', '.join(fields)}")
        ids = [i for f in fields for i in r[f]]
        if any(not isinstance(i, int) or not 0 <= i < vocab_size for i in ids):
            raise PortableDataError(f"{p}:{n}: token ids outside the target's vocabulary of {vocab_size} "
                                    "(a file made with another tokenizer?)")
    return [r for _, r in numbered]
