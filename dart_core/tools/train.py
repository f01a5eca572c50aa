"""`python -m dart_core train ...` and `python -m dart_core train-data ...`: the draft head's training commands.

train-data generate: answer ShareGPT prompts with the target itself (jsonl, resumable).
train-data export:   the training data and the fixed held-out set as token ids in one folder, for a machine
                     without the data packages (dart_core.training.portable).
train:               train a head on those responses plus ShareGPT conversations as written (and a user's own
                     chats, --chats), with the target's features and labels computed on the fly, so no sequence is
                     seen more than once per pass. Checkpoints every eval; `--resume` continues a stopped run with
                     fresh sequences. `--format authors` writes the head in the DART authors' format.
                     Under `torchrun --nproc_per_node N -m dart_core train ...` N processes train it data-parallel.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from ..draft_head import DraftHeadError
from ..formats.head_formats import authors_compatible, load_head
from ..formats.jsonl import read_jsonl
from ..machine.kernels import BATCH_ROWS
from ..setup.loading import load_ngram, load_target, stop_ids
from ..setup.models import resolve_model_path
from ..training import distributed
from ..training import portable
from ..training.chats import TrainingDataError, chat_file_records, read_chats
from ..training.data import (ExampleStream, ResponseSettings, fixed_heldout, generate_responses, same_source,
                             sharegpt_sequences, stdlib_code_sequences)
from ..training.trainer import FORMATS, Trainer, TrainConfig
from .args import BATCH_DTYPE_HELP, DTYPE_CHOICES, THINKING_HELP, CliError, add_model_args

TRAINABLE = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}   # model_type -> name: what the trainer serves
AUTO_FEATURE_BATCH = 16   # sequences per target forward that --feature-batch auto measures against one


def register(sub) -> None:
    g = sub.add_parser("train-data", help="generate target responses to ShareGPT prompts (training data), or "
                                          "export the data as token ids for another machine")
    g.add_argument("action", choices=["generate", "export"])
    g.add_argument("--model", default="default")
    g.add_argument("--out", required=True, help="generate: a jsonl file (appended; an interrupted run resumes); "
                                                "export: a folder")
    g.add_argument("--limit", type=int, default=2000, help="generate: prompts to answer")
    g.add_argument("--skip", type=int, default=0,
                   help="generate: leave out the first N prompts (answered before, into a file this machine lacks)")
    g.add_argument("--prompts-from", default=None, metavar="FILE",
                   help="generate: answer the prompts of this file (an export's prompts.jsonl.gz) instead of "
                        "ShareGPT's")
    g.add_argument("--seconds", type=float, default=0.0,
                   help="generate: stop after this many seconds, the last batch's answers cut there (0 = answer "
                        "them all)")
    g.add_argument("--sharegpt", type=int, default=20000, help="export: ShareGPT conversations as written")
    g.add_argument("--code", type=int, default=2000, help="export: standard-library code sequences")
    g.add_argument("--prompts", type=int, default=20000, help="export: ShareGPT prompts for generate")
    g.add_argument("--max-tokens", type=int, default=512, help="export: tokens per sequence at most")
    g.add_argument("--seed", type=int, default=0, help="export: the shuffle of the conversations and prompts")
    g.add_argument("--thinking", action="store_true", help=THINKING_HELP)
    g.add_argument("--batch-size", type=int, default=32)
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--dtype", default="fast", choices=DTYPE_CHOICES, help=BATCH_DTYPE_HELP)
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    g.set_defaults(handler=cmd_train_data)

    t = sub.add_parser("train", help="train a DART draft head")
    add_model_args(t, dtype_default="fast", dtype_help=BATCH_DTYPE_HELP)
    t.add_argument("--responses", action="append", default=[], help="jsonl from train-data generate (repeatable)")
    t.add_argument("--sharegpt", type=int, default=20000, help="ShareGPT conversations as written (0 = none)")
    t.add_argument("--code", type=int, default=0,
                   help="HumanEval-style code sequences from the Python standard library (0 = none)")
    t.add_argument("--chats", action="append", default=[], metavar="FILE.jsonl",
                   help="your own chats (repeatable): one conversation per line, {\"messages\": [{\"role\": "
                        "\"user\"|\"assistant\"|\"system\", \"content\": ...}]} or ShareGPT's {\"conversations\": "
                        "[{\"from\": \"human\"|\"gpt\", \"value\": ...}]}; every assistant reply is a sequence")
    t.add_argument("--thinking", action="store_true", help=THINKING_HELP)
    t.add_argument("--format", default="dartlab", choices=FORMATS,
                   help="the head written to OUT/best: 'dartlab' (ours) or 'authors' (the DART authors' files, "
                        "loaded by their code unchanged; trained in their architecture)")
    t.add_argument("--max-tokens", type=int, default=512, help="tokens per training sequence at most")
    t.add_argument("--heldout", type=int, default=48, help="sequences kept out of training for the metrics")
    t.add_argument("--heldout-set", choices=["random", "fixed"], default="random",
                   help="random: the first --heldout of this run's shuffled data; fixed: the same 32 ShareGPT "
                        "conversations and 16 standard-library functions for every run, whatever its data "
                        "(the learning curve compares runs on it)")
    t.add_argument("--heldout-file", default=None, metavar="FILE",
                   help="hold out these records instead (e.g. the heldout.jsonl of `train-data export`: the fixed "
                        "set made on another machine), and every record of the same source text")
    t.add_argument("--out", required=True, help="run folder: checkpoints, and best/ (the head to ship)")
    t.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0 = run the schedule)")
    t.add_argument("--steps", type=int, default=1200, help="optimizer steps in the schedule")
    t.add_argument("--schedule", choices=["steps", "time"], default="steps",
                   help="time: the learning rate's cosine runs out with --minutes (or --steps, if sooner), so a "
                        "session on a device of unknown speed ends annealed; it spans one session")
    t.add_argument("--decay-steps", type=int, default=0, metavar="N",
                   help="warmup-stable-decay: the rate holds at --lr until the last N of --steps, then anneals "
                        "(0: the cosine runs over all of --steps)")
    t.add_argument("--branch-from", default=None, metavar="RUN_DIR",
                   help="start from another run's checkpoint and best head, copied into --out (RUN_DIR is left as "
                        "it is); e.g. a long run's trunk annealed with --steps STEP+N --decay-steps N while the "
                        "trunk goes on. Once --out holds the branch's own checkpoint, that one is resumed")
    t.add_argument("--n-mask", type=int, default=5)
    t.add_argument("--draft-vocab", type=int, default=8192, help="0 = the full target vocabulary")
    t.add_argument("--anchors", type=int, default=256, help="anchor positions per sequence (up to)")
    t.add_argument("--accumulate", type=int, default=2,
                   help="sequences per optimizer step in each process (under torchrun: times the processes)")
    t.add_argument("--sequence-batch", type=int, default=1, metavar="N",
                   help="of those, sequences per forward of the head (padded to the longest): on a GPU one "
                        "sequence's forward leaves it idle on Python; the gradients are the same whatever N")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--row-decay", type=float, default=0.8)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--checkpoint-minutes", type=float, default=10.0, metavar="M",
                   help="also checkpoint between evaluations at least this often, so a machine that stops "
                        "mid-run loses at most M minutes (each evaluation checkpoints too)")
    t.add_argument("--head-fp32", action="store_true",
                   help="train the head in fp32 (default: bf16 autocast where this CPU or GPU has native bf16)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--vocab-ngram", default="default",
                   help="n-gram table whose unigram counts help choose the draft vocabulary ('none' = labels only)")
    t.add_argument("--feature-cache", default=None, metavar="DIR",
                   help="keep the target's features and labels of every sequence here (about 3.5 KB per token), "
                        "so later epochs and resumed runs skip the target's forward")
    t.add_argument("--feature-batch", default="1", metavar="N|auto",
                   help="training sequences whose features and labels come from one target forward (padded; on a "
                        f"GPU one sequence per forward leaves it idle on Python); auto: {AUTO_FEATURE_BATCH} if "
                        "that measures faster per token than 1 on the first training sequences, else 1")
    t.add_argument("--resume", action="store_true")
    t.add_argument("--init-from", default=None, metavar="HEAD_DIR",
                   help="start from a trained head (its K and draft vocabulary) with a fresh schedule; its "
                        "provenance and training time are kept in the new head's metrics")
    t.set_defaults(handler=cmd_train)


def _load(model: str, dtype: str, device: str):
    target = load_target(model, device, dtype, rows_measured=BATCH_ROWS, forward="transformers")   # batched, no cache
    return target, stop_ids(target)


def cmd_train_data(args) -> int:
    out = Path(args.out)
    if not out.parent.is_dir():
        raise CliError(f"cannot write {out}: folder {out.parent} does not exist")
    if args.action == "export":
        return _export(args, out)
    if args.limit < 1 or args.skip < 0:
        raise CliError(f"--limit must be at least 1 and --skip at least 0 (got {args.limit}, {args.skip})")
    target, stops = _load(args.model, args.dtype, args.device)
    prompts = None
    if args.prompts_from:
        try:
            prompts = [(r["id"], r["prompt_ids"]) for r in
                       portable.read_records(args.prompts_from, target.vocab_size, need_response=False)]
        except portable.PortableDataError as exc:
            raise CliError(str(exc)) from None
    settings = ResponseSettings(limit=args.limit, skip=args.skip, batch_size=args.batch_size,
                                max_new_tokens=args.max_new_tokens, stop_ids=tuple(stops), seconds=args.seconds)
    n = generate_responses(target.model, target.tokenizer, out, settings, prompts)
    print(f"wrote {n} responses to {out}")
    return 0


def _export(args, out: Path) -> int:
    if min(args.sharegpt, args.code, args.prompts) < 0:
        raise CliError("--sharegpt, --code and --prompts count sequences: 0 or more")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))   # no weights: ids only
    done = portable.export(tokenizer, out, args.sharegpt, args.code, args.prompts, args.max_tokens, args.seed,
                           args.thinking)
    mib = sum(done["bytes"].values()) / 2**20
    print(f"wrote {done['heldout']} held-out records, {done['text']} training records and {done['prompts']} "
          f"prompts ({done['tokens']:,} tokens, {mib:.1f} MiB) to {out}")
    return 0


def gather_records(tokenizer, responses: list[str], sharegpt: int, max_tokens: int, seed: int, code: int = 0,
                   chats: list[str] = (), thinking: bool = False) -> tuple[list[dict], dict]:
    """Every training record, shuffled, and where they came from: {source: count} (chats files: their counts)."""
    records, sources = [], {}
    for path in responses:
        if not Path(path).is_file():
            raise CliError(f"responses file not found: {path}")
        mine = [r for r in read_jsonl(path) if r.get("response_ids")]
        for r in mine:  # keep sequences within the budget
            r["response_ids"] = r["response_ids"][: max(1, max_tokens - len(r["prompt_ids"]))]
        records.extend(mine)
        sources[f"responses:{path}"] = len(mine)
    for path in chats:
        try:
            mine, counts = chat_file_records(tokenizer, path, max_tokens, thinking)
        except TrainingDataError as exc:
            raise CliError(str(exc)) from None
        records.extend(mine)
        sources[f"chats:{path}"] = counts
    used = {r["id"] for r in records}
    if sharegpt:
        mine = sharegpt_sequences(tokenizer, used, sharegpt, max_tokens, seed, thinking)
        records.extend(mine)
        sources["sharegpt"] = len(mine)
    if code:
        mine = stdlib_code_sequences(tokenizer, code, max_tokens, thinking=thinking)
        records.extend(mine)
        sources["stdlib_code"] = len(mine)
    # a reply of under 2 tokens has no anchor: left out here, so every process always has a sequence to train on
    records = [r for r in records if len(r["response_ids"]) >= 2]
    random.Random(seed).shuffle(records)
    return records, sources


def unigram_counts(spec: str, vocab_size: int):
    """[V] token counts from an n-gram table (its 1-grams), or None."""
    table = load_ngram(spec, vocab_size)
    if table is None:
        return None
    if table.vocab_size != vocab_size:
        if spec == "default":   # the default model's table: another target's vocabulary is not its
            return None
        raise CliError(f"--vocab-ngram {spec} counts a vocabulary of {table.vocab_size}; the target has {vocab_size}")
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    counts[torch.from_numpy(table.keys[0].astype("int64"))] = torch.from_numpy(table.counts[0]).double()
    return counts


def _starting_head(path, target, head_format: str = "dartlab"):
    """The head named by --init-from, checked against the target (and, for --format authors, against what their
    format can hold), or None."""
    if path is None:
        return None
    try:
        head = load_head(path)
        head.check_target(target)
    except DraftHeadError as exc:
        raise CliError(f"--init-from {path}: {exc}") from None
    why = authors_compatible(head) if head_format == "authors" else None
    if why is not None:
        raise CliError(f"--init-from {path} cannot be trained into --format authors: {why}")
    return head


def check_trainable(model: str) -> dict:
    """The target's config.json, if it is a causal LM the trainer serves (Llama, Qwen2, Qwen3); a CliError naming
    what it is otherwise, before any weight is loaded."""
    path = Path(resolve_model_path(model)) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CliError(f"--model {model}: cannot read {path}: {exc}") from None
    kind = config.get("model_type")
    causal = all(str(a).endswith("ForCausalLM") for a in config.get("architectures") or ["ForCausalLM"])
    if kind not in TRAINABLE or not causal:
        raise CliError(f"--model {model} is a {kind!r} model ({', '.join(config.get('architectures') or [])}); "
                       f"the trainer serves {', '.join(TRAINABLE.values())} causal LMs")
    return config


def _check_taps(target, head_format: str) -> None:
    if head_format == "authors" and len(set(target.taps)) != 3:
        raise CliError(f"--format authors: the target has {target.num_layers} layers; the authors' code taps layers "
                       "2, N/2 and N-3 and needs them distinct (7 layers or more)")


def _launch_command(argv: list[str]) -> str:
    """The command as typed (near enough): torchrun's process count where torchrun started it."""
    world = distributed.launched_world_size()
    launcher = f"torchrun --nproc_per_node {world} -m" if world > 1 else "python -m"
    return f"{launcher} dart_core " + " ".join(shlex.quote(a) for a in argv)


def feature_batch(value: str) -> tuple[int, bool]:
    """--feature-batch: (sequences per target forward, whether to measure that against one)."""
    if value == "auto":
        return AUTO_FEATURE_BATCH, True
    if not value.isdigit() or int(value) < 1:
        raise CliError(f"--feature-batch takes a count of sequences (1 or more) or auto, got {value!r}")
    return int(value), False


def cmd_train(args) -> int:
    if args.schedule == "time" and not args.minutes > 0:
        raise CliError("--schedule time needs --minutes: the schedule runs out with it")
    if not 0 <= args.decay_steps <= args.steps:
        raise CliError(f"--decay-steps {args.decay_steps}: it takes 0 to --steps ({args.steps})")
    if args.accumulate < 1 or args.sequence_batch < 1:
        raise CliError(f"--accumulate and --sequence-batch count sequences: 1 or more (got {args.accumulate}, "
                       f"{args.sequence_batch})")
    if not args.checkpoint_minutes > 0:
        raise CliError(f"--checkpoint-minutes {args.checkpoint_minutes}: it takes a time above 0")
    if args.decay_steps and args.schedule == "time":
        raise CliError("--decay-steps anneals by steps; --schedule time anneals by the clock: choose one")
    if args.branch_from and not (Path(args.branch_from) / "ckpt.pt").is_file():
        raise CliError(f"--branch-from {args.branch_from}: no ckpt.pt there (a run folder of `train`)")
    feature_batch(args.feature_batch)   # a bad value is told before the slow load
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {out}: {exc.strerror}") from None
    for path in args.chats:  # every line checked before the slow load: a bad file is the commonest mistake
        try:
            read_chats(path)
        except TrainingDataError as exc:
            raise CliError(str(exc)) from None
    target_config = check_trainable(args.model)
    device = distributed.device_for(args.device)
    with distributed.process_group(device):
        return _train(args, out, device, target_config)


def _train(args, out: Path, device: str, target_config: dict) -> int:
    say = print if distributed.is_main() else (lambda *a, **k: None)
    cfg = TrainConfig(n_mask=args.n_mask, draft_vocab=args.draft_vocab, anchors=args.anchors,
                      accumulate=args.accumulate, sequence_batch=args.sequence_batch, lr=args.lr,
                      row_decay=args.row_decay, max_steps=args.steps,
                      minutes=args.minutes, eval_every=args.eval_every,
                      checkpoint_minutes=args.checkpoint_minutes, seed=args.seed, bf16=not args.head_fp32,
                      warmup=min(100, max(1, args.steps // 20)), head_format=args.format, schedule=args.schedule,
                      decay_steps=args.decay_steps)
    target, stops = _load(args.model, args.dtype, device)
    _check_taps(target, args.format)
    start = _starting_head(args.init_from, target, args.format)
    records, sources = gather_records(target.tokenizer, args.responses, args.sharegpt, args.max_tokens, args.seed,
                                      args.code, args.chats, args.thinking)
    given = None
    if args.heldout_file:
        try:
            given = portable.read_records(args.heldout_file, target.vocab_size)
        except portable.PortableDataError as exc:
            raise CliError(f"--heldout-file: {exc}") from None
    heldout_recs, train_recs = split_heldout(records, args, target.tokenizer, given)
    say(f"[train] {len(train_recs)} training sequences, {len(heldout_recs)} held out; "
        f"{distributed.world_size()} process(es)", flush=True)

    group, measure = feature_batch(args.feature_batch)
    stream = ExampleStream(target, train_recs, group, args.feature_cache, cfg.accumulate, distributed.world_size(),
                           measure=measure)
    heldout = stream.of_records(heldout_recs) if distributed.is_main() else []   # rank 0 evaluates
    stats = [] if start is not None else stream.of_records(train_recs[:96])   # a new head's vocabulary, scales
    provenance = {"target": _target_record(args.model, target_config, target), "thinking": args.thinking,
                  "data": {"sources": sources, "training_sequences": len(train_recs),
                           "heldout_sequences": len(heldout_recs),
                           "heldout_set": f"file:{args.heldout_file}" if given else args.heldout_set,
                           "max_tokens": args.max_tokens}}
    trainer = Trainer(target, stats, heldout, cfg, out, stop_ids=stops,
                      corpus_counts=unigram_counts(args.vocab_ngram, target.vocab_size), start_head=start,
                      provenance=provenance)
    branched = args.branch_from is not None and distributed.is_main() and branch(Path(args.branch_from), out)
    distributed.barrier()   # every process reads the copied checkpoint
    if (args.resume or args.branch_from) and trainer.resume():
        if branched:
            trainer.branched_from = {"run": args.branch_from, "step": trainer.step}
        say(f"[train] {'branched from ' + args.branch_from if branched else 'resumed'} at step {trainer.step} "
            f"({trainer.sequences_seen} sequences seen)", flush=True)
    say(f"[train] draft vocabulary covers {trainer.coverage:.1%} of held-out target tokens", flush=True)
    result = trainer.fit(stream, _launch_command(sys.argv[1:]))
    say(f"[train] features and labels: {stream.choice}", flush=True)
    say(f"[train] done: {result}", flush=True)
    return 0


def branch(source: Path, out: Path) -> bool:
    """Copy `source`'s checkpoint and best head into `out`, unless `out` holds a checkpoint of its own already (the
    branch, resumed). Returns whether it copied."""
    if (out / "ckpt.pt").is_file():
        return False
    if (source / "best").is_dir():
        shutil.copytree(source / "best", out / "best", dirs_exist_ok=True)
    shutil.copyfile(source / "ckpt.pt", out / "ckpt.tmp")
    os.replace(out / "ckpt.tmp", out / "ckpt.pt")   # whole, or not there
    return True


def split_heldout(records: list[dict], args, tokenizer, given: list[dict] | None = None
                  ) -> tuple[list[dict], list[dict]]:
    """(held-out records, training records): `given` (--heldout-file) or --heldout-set fixed keeps that set, and
    every record of the same source text, out of training; random takes the first --heldout of the shuffled
    records."""
    if given is not None or args.heldout_set == "fixed":
        heldout = given if given is not None else fixed_heldout(tokenizer, args.max_tokens, thinking=args.thinking)
        kept_out = {same_source(r["id"]) for r in heldout}
        train = [r for r in records if same_source(r["id"]) not in kept_out]
    else:
        heldout, train = records[: args.heldout], records[args.heldout:]
    if len(train) < 2 or not heldout:
        raise CliError(f"only {len(records)} sequences: too few to hold {len(heldout)} out and train on the rest")
    return heldout, train


def _target_record(name: str, config: dict, target) -> dict:
    return {"model": name, "model_type": config.get("model_type"), "architectures": config.get("architectures"),
            "layers": target.num_layers, "hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
            "dtype": str(target.dtype).removeprefix("torch."),
            "dtype_choice": target.dtype_choice.reason if target.dtype_choice else "asked for"}
