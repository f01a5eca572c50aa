"""Building the n-gram tables DART's tree search uses (the command: `python -m dart_core ngram build ...`).

Sources, tokenized with the target's tokenizer:
- `sharegpt`: every ShareGPT conversation (all turns), rendered whole in the model's chat template
  (`apply_chat_template(turns, tokenize=False)`) and then tokenized. The table then holds the n-grams the
  target really sees while decoding: the role markers, the end-of-turn token and the turn openings
  ("<|im_start|>assistant\\n" followed by a typical first word), with the same BPE boundaries as at run time.
  Tokenizing each turn on its own would lose exactly those n-grams.
- `generated:FILE.jsonl`: responses the target generated, one JSON object a line with a `text` field (and
  optionally the `prompt` it answered: then prompt and response are rendered as one chat, like ShareGPT).
  Bad lines are skipped and counted.

Counting is blockwise (a few thousand conversations at a time, then one merge), so memory stays a few hundred MB.
`--min-count N` drops top-order n-grams seen fewer than N times (the lower orders, which give the backoff's context
counts, are kept whole), which shrinks the file a lot at a small cost in hits.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm
from transformers import AutoConfig, AutoTokenizer

from ..formats.jsonl import JsonLines
from ..ngram import NGramError, NGramModel
from .chat import chat_text
from .datasets import iter_sharegpt
from .defaults import DEFAULT_NGRAM, cache_root
from .files import check_writable, write_atomic
from .models import ModelLoadError, resolve_model_path

DEFAULT_ORDER = 3
DEFAULT_MIN_COUNT = 1        # keep everything (see the size table in the report / docs)
DEFAULT_SOURCES = "sharegpt"
BLOCK_TOKENS = 4_000_000     # tokens counted per block before the partial counts are set aside
TOKENIZE_BATCH = 256         # conversations rendered and tokenized per batch


@dataclass
class BuildStats:
    sources: dict[str, dict] = field(default_factory=dict)   # name -> {"records", "tokens", "skipped"}
    tokens: int = 0
    streams: int = 0
    seconds: float = 0.0
    pruned_top: int = 0      # top-order n-grams dropped by min_count

    def to_dict(self) -> dict:
        return {"sources": self.sources, "tokens": self.tokens, "streams": self.streams,
                "seconds": round(self.seconds, 2), "pruned_top": self.pruned_top}


# ---------------------------------------------------------------------------------------------------- counting
def count_ngrams(streams: Iterable[Sequence[int]], vocab_size: int, order: int = DEFAULT_ORDER,
                 min_count: int = 1, block_tokens: int = BLOCK_TOKENS) -> NGramModel:
    """Like `NGramModel.build`, but counts blocks of streams separately and merges them once at the end.

    n-grams never cross stream boundaries. `min_count` > 1 drops top-order n-grams seen fewer times.
    """
    if order < 2:
        raise NGramError(f"n-gram order must be at least 2, got {order}")
    if min_count < 1:
        raise NGramError(f"min_count must be >= 1, got {min_count}")
    parts: list[NGramModel] = []
    block: list[Sequence[int]] = []
    size = 0
    for stream in streams:
        block.append(stream)
        size += len(stream)
        if size >= block_tokens:
            parts.append(NGramModel.build(block, vocab_size, order))
            block, size = [], 0
    if block or not parts:
        parts.append(NGramModel.build(block, vocab_size, order))
    model = merge_models(parts)
    return prune_top(model, min_count) if min_count > 1 else model


def merge_models(parts: Sequence[NGramModel]) -> NGramModel:
    """Sum the counts of several models of the same order and vocabulary in one pass per order."""
    if not parts:
        raise NGramError("nothing to merge")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    for p in parts[1:]:
        if (p.order, p.vocab_size) != (first.order, first.vocab_size):
            raise NGramError("can only merge n-gram models of the same order and vocabulary")
    keys, counts = [], []
    for k in range(first.order):
        allk = np.concatenate([p.keys[k] for p in parts])
        allc = np.concatenate([p.counts[k] for p in parts])
        order_idx = np.argsort(allk, kind="stable")
        allk, allc = allk[order_idx], allc[order_idx]
        if allk.size:
            starts = np.flatnonzero(np.concatenate([[True], allk[1:] != allk[:-1]]))
            keys.append(allk[starts])
            counts.append(np.add.reduceat(allc, starts).astype(np.int64))
        else:
            keys.append(allk)
            counts.append(allc.astype(np.int64))
        del allk, allc, order_idx
    return NGramModel(first.order, first.vocab_size, keys, counts)


def prune_top(model: NGramModel, min_count: int) -> NGramModel:
    """Drop top-order n-grams seen fewer than `min_count` times; lower orders stay whole."""
    if min_count <= 1:
        return model
    keep = model.counts[-1] >= min_count
    keys = list(model.keys[:-1]) + [model.keys[-1][keep]]
    counts = list(model.counts[:-1]) + [model.counts[-1][keep]]
    return NGramModel(model.order, model.vocab_size, keys, counts)


# ---------------------------------------------------------------------------------------------------- sources
def parse_sources(spec: str) -> list[tuple[str, Path | None]]:
    """'sharegpt,generated:out.jsonl' -> [("sharegpt", None), ("generated", Path("out.jsonl"))]."""
    out: list[tuple[str, Path | None]] = []
    for item in (s.strip() for s in (spec or "").split(",")):
        if not item:
            continue
        if item == "sharegpt":
            out.append(("sharegpt", None))
        elif item.startswith("generated:"):
            path = Path(item.split(":", 1)[1])
            if not str(path) or not path.is_file():
                raise NGramError(f"generated-text file not found: {path}")
            out.append(("generated", path))
        else:
            raise NGramError(f"unknown n-gram source {item!r}; use 'sharegpt' and/or 'generated:FILE.jsonl'")
    if not out:
        raise NGramError("no n-gram sources given")
    return out


def read_generated(path: Path, limit: int | None = None) -> tuple[list[list[dict] | str], list[str]]:
    """Records of a generated-text jsonl: a chat ([user, assistant] turns) when the line has a `prompt`, else
    the bare `text`. Returns (records, skipped reasons)."""
    records: list[list[dict] | str] = []
    skipped: list[tuple[int, str]] = []     # (line, why), told in line order
    lines = JsonLines(path)
    for n, rec in lines:
        if limit is not None and len(records) >= limit:
            break
        text = rec.get("text") if isinstance(rec, dict) else None
        if not isinstance(text, str) or not text.strip():
            skipped.append((n, f"line {n}: no non-empty string field 'text'"))
            continue
        prompt = rec.get("prompt")
        if isinstance(prompt, str) and prompt.strip():
            records.append([{"role": "user", "content": prompt}, {"role": "assistant", "content": text}])
        else:
            records.append(text)
    skipped += [(n, f"line {n}: not JSON") for n in lines.bad_lines]
    return records, [reason for _, reason in sorted(skipped)]


def render(tokenizer, record: list[dict] | str) -> str:
    """A record as text: a bare text as it is, a conversation in the chat template."""
    return record if isinstance(record, str) else chat_text(tokenizer, record)


def tokenize_records(tokenizer, records: Sequence[list[dict] | str], batch: int = TOKENIZE_BATCH,
                     progress=None) -> Iterator[list[int]]:
    """Token ids of each record, in batches (the fast tokenizer encodes a batch on all cores)."""
    for i in range(0, len(records), batch):
        texts = [render(tokenizer, r) for r in records[i: i + batch]]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        if progress is not None:
            progress.update(len(texts))
        yield from ids


def build_table(tokenizer, vocab_size: int, sources: Sequence[tuple[str, Path | None]], order: int = DEFAULT_ORDER,
                limit: int | None = None, min_count: int = DEFAULT_MIN_COUNT,
                progress: bool = True) -> tuple[NGramModel, BuildStats]:
    """Tokenize every source with `tokenizer` and count its n-grams. `limit`: records per source at most."""
    t0 = time.perf_counter()
    stats = BuildStats()
    loaded: list[tuple[str, list]] = []
    for name, path in sources:
        if name == "sharegpt":
            records: list = []
            for conv in iter_sharegpt():
                if limit is not None and len(records) >= limit:
                    break
                records.append(conv)
            loaded.append(("sharegpt", records))
            stats.sources["sharegpt"] = {"records": len(records), "tokens": 0, "skipped": 0}
        else:
            records, skipped = read_generated(path, limit)
            label = f"generated:{path}"
            loaded.append((label, records))
            stats.sources[label] = {"records": len(records), "tokens": 0, "skipped": len(skipped)}
            if skipped:
                print(f"[ngram] {path}: skipped {len(skipped)} bad line(s), e.g. {skipped[0]}", file=sys.stderr)

    total = sum(len(r) for _, r in loaded)
    bar = tqdm(total=total, unit="conv", desc="n-gram table", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)

    def streams() -> Iterator[list[int]]:
        for label, records in loaded:
            for ids in tokenize_records(tokenizer, records, progress=bar):
                stats.sources[label]["tokens"] += len(ids)
                stats.tokens += len(ids)
                stats.streams += 1
                if stats.streams % TOKENIZE_BATCH == 0:
                    bar.set_postfix_str(f"{stats.tokens / 1e6:.1f}M tokens", refresh=False)
                yield ids
        bar.set_postfix_str(f"{stats.tokens / 1e6:.1f}M tokens; merging counts")

    try:
        full = count_ngrams(streams(), vocab_size, order)
    finally:
        bar.close()
    model = prune_top(full, min_count)
    stats.pruned_top = int(full.keys[-1].size - model.keys[-1].size)
    stats.seconds = time.perf_counter() - t0
    return model, stats


# ---------------------------------------------------------------------------------------------------- output
def save_atomic(model: NGramModel, path) -> int:
    """Write the table so that no half-written file is ever seen. Returns the file size in bytes."""
    return write_atomic(path, model.save)


def load_tokenizer_and_vocab(model: str):
    """The target's tokenizer and vocabulary size (from its config: no weights are loaded)."""
    path = resolve_model_path(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        config = AutoConfig.from_pretrained(path)
    except OSError as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {model!r}: {str(exc).splitlines()[0]}") from exc
    vocab = getattr(config.get_text_config() if hasattr(config, "get_text_config") else config, "vocab_size", None)
    return tokenizer, int(vocab or len(tokenizer))


def default_cache_path() -> Path:
    return cache_root() / DEFAULT_NGRAM.name


def ensure_default_ngram(progress: bool = True) -> Path:
    """The default n-gram table: the shipped `assets/smollm2-ngram3.npz` if present, else a copy built from
    ShareGPT with the default model's tokenizer into the user cache (once, about a minute, with a progress bar)."""
    if DEFAULT_NGRAM.is_file():
        return DEFAULT_NGRAM
    out = default_cache_path()
    if out.is_file():
        return out
    check_writable(out)
    print(f"[dart] building the default n-gram table into {out} (once)", file=sys.stderr, flush=True)
    tokenizer, vocab = load_tokenizer_and_vocab("default")
    model, _ = build_table(tokenizer, vocab, parse_sources(DEFAULT_SOURCES), DEFAULT_ORDER,
                           min_count=DEFAULT_MIN_COUNT, progress=progress)
    save_atomic(model, out)
    return out
