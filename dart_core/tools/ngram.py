"""`python -m dart_core ngram build`: count the n-grams of ShareGPT (and generated text) into a table for the search;
`ngram convert`: between our .npz tables and the DART authors' .trie files."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..ngram import NGramModel
from ..formats.ngram_trie import read_trie, write_trie
from ..setup.files import check_writable, write_atomic
from ..setup.ngram_tables import (DEFAULT_MIN_COUNT, DEFAULT_ORDER, DEFAULT_SOURCES, build_table,
                                  load_tokenizer_and_vocab, parse_sources, save_atomic)
from .args import CliError


def table_summary(model: NGramModel) -> str:
    return ", ".join(f"{k + 1}-grams {model.keys[k].size:,}" for k in range(model.order))


def cmd_ngram_build(args) -> int:
    if args.order < 2:
        raise CliError(f"--order must be at least 2, got {args.order}")
    if args.limit is not None and args.limit < 1:
        raise CliError(f"--limit must be >= 1, got {args.limit}")
    if args.min_count < 1:
        raise CliError(f"--min-count must be >= 1, got {args.min_count}")
    sources = parse_sources(args.sources)
    out = check_writable(args.out)
    tokenizer, vocab = load_tokenizer_and_vocab(args.model)
    if max(1, int(vocab - 1).bit_length()) * args.order > 64:
        raise CliError(f"order {args.order} with a vocabulary of {vocab} does not fit in 64-bit keys")
    model, stats = build_table(tokenizer, vocab, sources, args.order, args.limit, args.min_count,
                               progress=not args.no_progress)
    t = time.perf_counter()
    size = save_atomic(model, out)
    save_s = time.perf_counter() - t
    result = {"out": str(out), "bytes": size, "order": model.order, "vocab_size": model.vocab_size,
              "ngrams": [int(k.size) for k in model.keys], "min_count": args.min_count, **stats.to_dict(),
              "save_seconds": round(save_s, 2)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"wrote {out} ({size / 1e6:.1f} MB): order {model.order}, {stats.tokens:,} tokens from "
              f"{stats.streams:,} streams; {table_summary(model)}"
              + (f"; dropped {stats.pruned_top:,} top-order n-grams seen < {args.min_count} times"
                 if args.min_count > 1 else "")
              + f"; {stats.seconds + save_s:.0f} s")
    return 0


TABLE_SUFFIXES = (".npz", ".trie")


def cmd_ngram_convert(args) -> int:
    src, dst = Path(args.input), Path(args.output)
    for path in (src, dst):
        if path.suffix not in TABLE_SUFFIXES:
            raise CliError(f"{path}: use a .npz (our table) or a .trie (the DART authors') file")
    if src.suffix == dst.suffix:
        raise CliError(f"{src} and {dst} are both {src.suffix} files: nothing to convert")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise CliError(f"--vocab-size must be >= 1, got {args.vocab_size}")
    out = check_writable(dst)
    t = time.perf_counter()
    progress = not args.no_progress
    if src.suffix == ".trie":
        model = read_trie(src, vocab_size=args.vocab_size, progress=progress)
        size = save_atomic(model, out)
    else:
        model = NGramModel.load(src)
        if args.vocab_size is not None and args.vocab_size != model.vocab_size:
            raise CliError(f"{src} has a vocabulary of {model.vocab_size}, not {args.vocab_size}")
        size = write_atomic(out, lambda tmp: write_trie(model, tmp, progress=progress))
    seconds = time.perf_counter() - t
    result = {"in": str(src), "out": str(out), "bytes": size, "order": model.order, "vocab_size": model.vocab_size,
              "ngrams": [int(k.size) for k in model.keys], "seconds": round(seconds, 2)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"wrote {out} ({size / 1e6:.1f} MB): order {model.order}, vocabulary {model.vocab_size:,}"
              + (" (the largest token + 1; --vocab-size gives the target's)"
                 if src.suffix == ".trie" and args.vocab_size is None else "")
              + f"; {table_summary(model)}; {seconds:.1f} s")
    return 0


def register(sub) -> None:
    p = sub.add_parser("ngram", help="n-gram tables for DART's tree search")
    nsub = p.add_subparsers(dest="ngram_command", required=True)
    b = nsub.add_parser("build", help="count n-grams of ShareGPT (and generated text) with the target tokenizer")
    b.add_argument("--model", default="default", help="whose tokenizer: 'default' or a transformers folder")
    b.add_argument("--order", type=int, default=DEFAULT_ORDER)
    b.add_argument("--out", required=True, help="the .npz file to write")
    b.add_argument("--sources", default=DEFAULT_SOURCES,
                   help="comma list of 'sharegpt' and 'generated:FILE.jsonl' (lines with a 'text' field)")
    b.add_argument("--limit", type=int, default=None, help="records per source at most")
    b.add_argument("--min-count", type=int, default=DEFAULT_MIN_COUNT,
                   help="drop top-order n-grams seen fewer times (2 drops the singletons: a much smaller file)")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    b.set_defaults(handler=cmd_ngram_build)
    c = nsub.add_parser("convert", help="convert between .npz tables and the DART authors' .trie files")
    c.add_argument("input", help="the .npz or .trie file to read")
    c.add_argument("output", help="the .trie or .npz file to write")
    c.add_argument("--vocab-size", type=int, default=None,
                   help="the target's vocabulary size (a .trie does not store it; default: its largest token + 1)")
    c.add_argument("--no-progress", action="store_true")
    c.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    c.set_defaults(handler=cmd_ngram_convert)
