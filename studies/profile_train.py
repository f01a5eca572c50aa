"""Where one training step of the draft head spends its time, on the real training loop (`Trainer.fit`).

    python studies/profile_train.py --steps 10 --skip 2 [--no-bf16] [--target-dtype fp32] [--anchors 512]
        [--accumulate 4 --sequence-batch 4] [--feature-cache runs/fcache] [--json runs/prof.json]

The phases are cut by wall-clock marks (every op here is synchronous on the CPU): hooks on the head's output layer
(forward and the gradients of its input and output) and on the optimizer, and timed wrappers around the trainer's
own helpers (the target's forward, the anchor batch, the loss, the row statistics). The first `--skip` steps
(one-time kernel set-up) are left out. Anchor tokens per second = anchors scored / seconds of the measured steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dart_core.machine.kernels import BATCH_ROWS  # noqa: E402
from dart_core.machine.records import dtype_spelling  # noqa: E402
from dart_core.setup.loading import load_target, stop_ids  # noqa: E402
from dart_core.tools.train import gather_records, unigram_counts  # noqa: E402
from dart_core.training import trainer as trainer_mod  # noqa: E402
from dart_core.training.data import cached_example, sequence_example  # noqa: E402
from dart_core.training.trainer import Trainer, TrainConfig  # noqa: E402

PHASES = ["target forward (features, labels)", "anchor batch", "head layer forward", "output layer forward",
          "loss forward", "loss backward", "output layer backward", "head layer backward", "row statistics",
          "grad clip", "optimizer step"]


class Marks:
    """Time marks; each closes the phase named by it (the time since the previous mark), per optimizer step."""

    def __init__(self):
        self.step, self.last = 0, time.perf_counter()
        self.per_step: list[dict] = [defaultdict(float)]

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.per_step[-1][phase] += now - self.last
        self.last = now

    def next_step(self) -> None:
        self.per_step.append(defaultdict(float))


def timed(fn, marks: Marks, before: str | None, after: str):
    """fn wrapped so that the time up to its call closes `before` and its own time closes `after`."""
    def wrapper(*args, **kwargs):
        if before:
            marks(before)
        out = fn(*args, **kwargs)
        marks(after)
        return out
    return wrapper


def hook_output_layer(layer: torch.nn.Module, marks: Marks) -> None:
    """Marks around the output layer's forward, and when its output's and its input's gradients arrive."""
    def pre(module, args):
        marks("head layer forward")
        if args[0].requires_grad:
            args[0].register_hook(lambda g: marks("output layer backward"))

    def post(module, args, out):
        marks("output layer forward")
        if out.requires_grad:
            out.register_hook(lambda g: marks("loss backward"))

    layer.register_forward_pre_hook(pre)
    layer.register_forward_hook(post)


def instrument(trainer: Trainer, marks: Marks) -> None:
    trainer_mod.sequence_batch = timed(trainer_mod.sequence_batch, marks, None, "anchor batch")
    trainer_mod.soft_ce = timed(trainer_mod.soft_ce, marks, "output layer forward", "loss forward")
    trainer_mod.row_stats = timed(trainer_mod.row_stats, marks, "head layer backward", "row statistics")
    hook_output_layer(trainer.head.lm_head, marks)
    trainer.opt.register_step_pre_hook(lambda *a: marks("grad clip"))
    trainer.opt.register_step_post_hook(lambda *a: (marks("optimizer step"), marks.next_step()))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--target-dtype", default="fast", help="the target's dtype (train's --dtype; default fast)")
    p.add_argument("--no-bf16", action="store_true", help="the head in fp32 (no bf16 autocast)")
    p.add_argument("--feature-cache", default=None, help="train's --feature-cache (run twice: the second run reads)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--skip", type=int, default=2, help="first steps left out (set-up)")
    p.add_argument("--n-mask", type=int, default=5)
    p.add_argument("--draft-vocab", type=int, default=12288)
    p.add_argument("--anchors", type=int, default=256)
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--sequence-batch", type=int, default=1, help="of those, sequences per head forward")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--out", default="runs/profile-train")
    p.add_argument("--json", default=None, help="write the per-phase table here")
    p.add_argument("--ops", type=int, default=0, help="also print torch.profiler's top N ops by self time")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.model, "cpu", args.target_dtype, rows_measured=BATCH_ROWS)
    need = args.steps * args.accumulate + 8
    records, _ = gather_records(target.tokenizer, [], need * 2, 512, 0)
    records = records[:need]

    def example(i):
        rec = records[8 + i]
        if args.feature_cache:
            return cached_example(args.feature_cache, target, rec["prompt_ids"], rec["response_ids"])
        return sequence_example(target, rec["prompt_ids"], rec["response_ids"])

    stats = [sequence_example(target, r["prompt_ids"], r["response_ids"]) for r in records[:8]]
    cfg = TrainConfig(n_mask=args.n_mask, draft_vocab=args.draft_vocab, anchors=args.anchors,
                      accumulate=args.accumulate, sequence_batch=args.sequence_batch, max_steps=args.steps,
                      eval_every=10**9, warmup=1,
                      bf16=not args.no_bf16)
    trainer = Trainer(target, stats, stats[:1], cfg, args.out, stop_ids=stop_ids(target),
                      corpus_counts=unigram_counts("default", target.vocab_size))
    marks = Marks()
    instrument(trainer, marks)
    anchors_per_step = []
    seen = [0]

    def next_sequence(i):
        out = example(i)
        marks("target forward (features, labels)")
        return out

    original_step = trainer.opt.step

    def counting_step(*a, **k):  # anchors of each optimizer step
        result = original_step(*a, **k)
        anchors_per_step.append(trainer.tokens_seen - seen[0])
        seen[0] = trainer.tokens_seen
        return result

    trainer.opt.step = counting_step
    marks.last = time.perf_counter()
    if args.ops:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            trainer.fit(next_sequence)
        print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=args.ops,
                                                                  max_name_column_width=50))
    else:
        trainer.fit(next_sequence)
    ran = {"target_dtype": dtype_spelling(target.dtype),             # 'fast' resolved to what ran, and
           "head_bf16": trainer.bf16}                                 # the head's autocast only where native
    report(marks.per_step[args.skip: args.steps], anchors_per_step[args.skip: args.steps], args, ran)
    return 0


def report(steps: list[dict], anchors: list[int], args, ran: dict) -> None:
    """The per-phase table, and anchors per second: over all measured steps, and the median of the steps' own rates
    (robust to a step slowed by another process on these 2 cores). `ran`: the dtypes that ran, not those asked."""
    total = {p: sum(s.get(p, 0.0) for s in steps) for p in PHASES}
    seconds = sum(total.values())
    n = len(steps)
    rates = sorted(a / sum(s.values()) for a, s in zip(anchors, steps))
    rows = [{"phase": p, "ms_per_step": round(1000 * total[p] / n, 1), "share": round(total[p] / seconds, 3)}
            for p in PHASES]
    result = {"steps": n, "anchors_per_step": sum(anchors) / n, "seconds_per_step": round(seconds / n, 3),
              "anchor_tokens_per_s": round(sum(anchors) / seconds, 1),
              "median_step_anchor_tokens_per_s": round(rates[n // 2], 1), "threads": torch.get_num_threads(),
              **ran, "feature_cache": args.feature_cache, "n_mask": args.n_mask,
              "anchors": args.anchors, "accumulate": args.accumulate,
              "sequence_batch": args.sequence_batch, "phases": rows}
    print("| phase | ms per step | share |\n|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {r['ms_per_step']} | {100 * r['share']:.1f}% |")
    print(json.dumps({k: v for k, v in result.items() if k != "phases"}))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
