"""The draft head's training run on a remote GPU machine, in one command of at most 10 minutes: the target answers the
exported prompts (its own responses, the path decoding follows), the head trains on those and on the exported
text for what is left of --seconds (less a reserve for the last evaluation and the packing), with a schedule that
ends annealed then, and the best head comes back in parts.

    # on the device (scripts/gpu-train.sh wraps this; the model is the default's GGUF, carried in parts)
    python -m scripts.gpu_train --model .gpu/gguf --data .gpu/data --init-from assets/smollm2-dart-head \
        --device cuda --seconds 540 --generate-seconds 90 --out $OUT
    # here, afterwards: the run folder back (the head from its parts, the slim checkpoint beside it)
    python -m scripts.device_payload join FILES_AT/head runs/gpu-head/best && cp FILES_AT/ckpt.pt runs/gpu-head/

--model: a .gguf file, a transformers folder, or a folder of parts (`device_payload split`) joined first.
--data: a folder from `python -m dart_core train-data export` (held-out set, text, prompts, as token ids).
Writes into --out, 8 files at most, as a remote command brings back: head/ (the best head with its metrics.json, in
parts of at most 15.9 MiB: 3 for the default's head), ckpt.pt (the run's checkpoint without weights: its held-out
history, what `scripts.learning_curve add` reads), summary.json (rates: response tokens/s, anchor tokens/s) and
train.log. What would not come back is said at the end (`device_payload.comes_back`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from dart_core.tools.cli import main as dart
from dart_core.training.data import read_jsonl
from dart_core.training.portable import HELDOUT, PROMPTS, TEXT
from dart_core.training.records import minutes_trained
from scripts.device_payload import MANIFEST, comes_back, join, split


MIN_TRAIN_SECONDS = 5.0


class Tee:
    """Writes to the console and to a log file at once (the call's output keeps only its last 12,000 characters)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


def model_path(model: Path, work: Path) -> str:
    """A .gguf file or a model folder as given; a folder of parts joined into work/ first."""
    if model.is_dir() and (model / MANIFEST).is_file():
        name = json.loads((model / MANIFEST).read_text())["name"]
        return str(join(model, work / name))
    return str(model)


def spent_before_python() -> float:
    """Seconds since scripts/gpu-train.sh started (it sets GPU_TRAIN_STARTED): the call's clock, not Python's."""
    try:
        return max(time.time() - float(os.environ["GPU_TRAIN_STARTED"]), 0.0)
    except (KeyError, ValueError):
        return 0.0


def run(args, started: float) -> dict:
    """started: time.monotonic() at the script's start; everything ends by started + args.seconds."""
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    model = model_path(Path(args.model), work)
    summary: dict = {"device": args.device, "model": model}

    own = work / "own-responses.jsonl"
    t0 = time.perf_counter()
    if args.generate_seconds > 0:
        code = dart(["train-data", "generate", "--model", model, "--device", args.device, "--dtype", args.dtype,
                     "--prompts-from", str(data / PROMPTS), "--limit", str(args.generate_limit),
                     "--batch-size", str(args.generate_batch), "--max-new-tokens", str(args.max_new_tokens),
                     "--seconds", str(args.generate_seconds), "--out", str(own)])
        if code:
            raise SystemExit(f"generation failed (exit {code})")
    answered = read_jsonl(own)
    seconds = time.perf_counter() - t0
    response_tokens = sum(len(r["response_ids"]) for r in answered)
    summary["generation"] = {"responses": len(answered), "response_tokens": response_tokens,
                             "seconds": round(seconds, 1),
                             "response_tokens_per_s": round(response_tokens / seconds, 1) if seconds else None}
    print(f"[gpu-train] {len(answered)} own responses, {response_tokens:,} tokens in {seconds:.0f} s", flush=True)

    # training gets what is left, less the reserve for the last evaluation and the packing: a run cut by the
    # call's limit would bring nothing back
    minutes = (started + args.seconds - args.reserve_seconds - time.monotonic()) / 60
    if minutes < MIN_TRAIN_SECONDS / 60:
        raise SystemExit(f"only {minutes * 60:.0f} s left for training: raise --seconds or lower --generate-seconds")
    summary["training_minutes_planned"] = round(minutes, 2)
    run_dir = work / "run"
    responses = (["--responses", str(own)] if answered else []) + ["--responses", str(data / TEXT)]
    start = ["--init-from", args.init_from] if args.init_from else []
    command = ["train", "--model", model, "--device", args.device, *responses, "--sharegpt", "0",
               "--heldout-file", str(data / HELDOUT), "--schedule", "time", "--minutes", f"{minutes:.2f}",
               "--steps", str(args.steps), "--lr", str(args.lr), "--eval-every", str(args.eval_every),
               "--vocab-ngram", "none", "--feature-batch", args.feature_batch, "--accumulate", str(args.accumulate),
               "--sequence-batch", str(args.sequence_batch), "--out", str(run_dir), *start,
               *args.train_args]
    summary["train_command"] = "python -m dart_core " + " ".join(command)
    code = dart(command)
    if code:
        raise SystemExit(f"training failed (exit {code})")
    split(run_dir / "best", out / "head", args.part_mib)
    # the checkpoint without its weights and optimizer moments: the learning curve's input (its held-out history)
    state = {k: v for k, v in torch.load(run_dir / "ckpt.pt", weights_only=False, map_location="cpu").items()
             if k not in ("head", "opt")}
    torch.save(state, out / "ckpt.pt")
    spent = minutes_trained(state["sessions"])
    history = state["history"]
    summary["training"] = {"anchor_tokens": state["tokens_seen"], "steps": state["step"],
                           "minutes": round(spent, 2),
                           "anchor_tokens_per_s": round(state["tokens_seen"] / (60 * spent)) if spent else None,
                           "heldout_first": history[0] if history else None,
                           "heldout_last": history[-1] if history else None,
                           "features_and_labels": state["sessions"][-1].get("features_and_labels")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a .gguf file, a model folder, or a folder of parts")
    p.add_argument("--data", required=True, help="a folder from `train-data export`")
    p.add_argument("--init-from", default=None, help="the head to continue (none: a new head)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", help="the target's dtype while it answers the prompts")
    p.add_argument("--seconds", type=float, default=540.0,
                   help="the whole run, model loading and packing included (a remote command runs at most 600)")
    p.add_argument("--generate-seconds", type=float, default=90.0, help="0: no own responses")
    p.add_argument("--generate-limit", type=int, default=20000)
    p.add_argument("--generate-batch", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--reserve-seconds", type=float, default=60.0,
                   help="kept back from training for its last evaluation and the packing")
    p.add_argument("--steps", type=int, default=1_000_000, help="at most (the time limit ends the run first)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--feature-batch", default="auto",
                   help="sequences per target forward for the features and labels (auto: measured on the device)")
    p.add_argument("--accumulate", type=int, default=8, help="sequences per optimizer step")
    p.add_argument("--sequence-batch", type=int, default=8,
                   help="of those, sequences per forward of the head (one sequence's forward leaves a GPU idle)")
    p.add_argument("--part-mib", type=float, default=15.9, help="under the 16 MiB a file that comes back may have")
    p.add_argument("--work", default="/tmp/gpu-train")
    p.add_argument("--out", required=True)
    p.add_argument("train_args", nargs="*", help="after --: more arguments for train")
    args = p.parse_args(argv)
    started = time.monotonic() - spent_before_python()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "a") as log, contextlib.redirect_stdout(Tee(sys.stdout, log)):
        summary = run(args, started)
        print(json.dumps(summary, indent=2), flush=True)
        lost = comes_back(out)
        print("[gpu-train] " + ("NOT ALL OF IT COMES BACK: " + "; ".join(lost) if lost else
                                f"{out} comes back whole"), flush=True)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
