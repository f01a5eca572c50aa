"""The device check: DART's decoding on a device, dtype by dtype, with tiny models and (where its files are on the
machine) the default model. One line per check and a summary; exit status 1 if any check failed.

    python -m scripts.gpu_check --device cuda     # what scripts/gpu-check.sh runs on a GPU (a few minutes)
    python -m scripts.gpu_check --device cpu --quick   # the same code paths on a CPU (the test suite runs this)

Checks, per dtype (fp32, bf16, fp16) and forward (transformers', and the lean one with its steps as CUDA graphs):
- lossless: DART (our own head and a head in the DART authors' format, on Llama and Qwen3 targets) gives exactly
  the target's own greedy tokens in fp32; in bf16 / fp16 a tree verified in one batch may round differently from
  one token at a time at near-ties, so there the check is that most prompts agree token for token;
- timings: every step's phases were timed (CUDA events on a GPU) and add up to no more than the wall time.
Then training: `train --format authors` for a few steps on a tiny Qwen3 target, data-parallel over every GPU here
(torchrun, NCCL; on a CPU one process in --quick, two over gloo otherwise), bf16 autocast where the device has it;
the head it writes must load and decode losslessly, and its anchor tokens per second are printed.
Then, with the default model (SmolLM2-135M-Instruct) if it is on this machine: DART against plain decoding on 10
MT-bench prompts, greedy, token-identical in fp32, with both speeds; and the shipped head trained on for
--train-seconds (passages of the project's own docs as replies, the target's features and labels computed as it goes,
8 sequences per head forward): its anchor tokens per second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from dart_core.decoding import GenerationConfig, run
from dart_core.errors import DartError
from dart_core.formats.jsonl import write_jsonl
from dart_core.metrics import Metrics
from dart_core.proposers import DartProposer, HeadDrafter, VanillaProposer
from dart_core.setup.chat import encode_prompt
from dart_core.setup.datasets import EXAMPLES, DatasetError, mtbench_prompts
from dart_core.setup.defaults import DEFAULT_HEAD, cache_root
from dart_core.setup.loading import DraftSettings, load, load_draft
from dart_core.setup.tiny_models import plain_greedy_reference, random_head, random_prompts, tiny_target
from dart_core.tree_search import SearchConfig
from dart_core.draft_head import DraftConfig, DraftHead
from dart_core.formats.head_formats import save_authors
from dart_core.lean_forward import CUDA, EAGER
from dart_core.target import TargetModel
from dart_core.training.records import minutes_trained
from dart_core.setup.tiny_training import save_tiny_qwen3, write_chats

ROOT = Path(__file__).resolve().parent.parent

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LOW_PRECISION_AGREEMENT = 0.75   # share of prompts token-identical where rounding may split near-ties


class Report:
    def __init__(self):
        self.failed: list[str] = []

    def check(self, name: str, ok: bool, detail: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
        if not ok:
            self.failed.append(name)


FORWARDS = ("transformers", "lean")


def tiny_on(forward: str, family: str, dtype: str, device: str) -> TargetModel:
    """A tiny target on transformers' forward or on the lean one; the lean one at fixed shapes, captured as CUDA
    graphs on a GPU and run eagerly elsewhere (the path a GPU replays, rehearsed)."""
    target = tiny_target(family, seed=3, dtype=DTYPES[dtype], device=device)
    if forward == "lean":
        target.use_lean()
        target.lean.graphs = CUDA if device.startswith("cuda") else EAGER
        target.lean.native = None   # as on a GPU: no C layer (whose cache is fp32 whatever the weights)
    return target


def tiny_lossless(report: Report, device: str, dtype: str, n_prompts: int, folder: Path) -> None:
    for forward, family in ((f, fam) for f in FORWARDS for fam in ("llama", "qwen3")):
        target = tiny_on(forward, family, dtype, device)
        authors = DraftHead.random(DraftConfig.for_target(target.config, n_mask=3, tie_output=False,
                                                          double_norm=True), seed=2)
        save_authors(authors, folder / family)   # written by the project's writer, read by its reader
        heads = {"own head": random_head(target, seed=1),
                 "authors' head": load_draft(str(folder / family), target)}
        for name, head in heads.items():
            proposer = DartProposer(HeadDrafter(head, target), SearchConfig(node_budget=30))
            same, steps, timed = 0, 0, True
            batch = random_prompts(n_prompts, target.vocab_size, seed=4)
            for prompt in batch:
                expected = plain_greedy_reference(target, prompt, 16)
                trace = run(target, proposer, prompt, GenerationConfig(max_new_tokens=16))
                same += trace.output_ids == expected
                steps += len(trace.steps)
                timed &= all(min(s.timings.values()) >= 0 and sum(s.timings.values()) <= s.elapsed + 1e-3
                             for s in trace.steps)
            need = len(batch) if dtype == "fp32" else int(LOW_PRECISION_AGREEMENT * len(batch))
            report.check(f"{dtype} {forward} {family} {name} lossless", same >= need,
                         f"{same}/{len(batch)} prompts token-identical to the target's own greedy decoding "
                         f"({steps} steps)")
            report.check(f"{dtype} {forward} {family} {name} timings", timed, "every phase timed, within the wall time")


def why_failed(stderr: str) -> str:
    """The line of a failed run's error output that says why: the last naming an error (a progress bar may follow
    it), else the last."""
    lines = stderr.strip().splitlines() or ["no output"]
    return next((line for line in reversed(lines) if "error" in line.lower()), lines[-1])


def training_processes(device: str, quick: bool) -> int:
    if device.startswith("cuda"):
        return max(torch.cuda.device_count(), 1)
    return 1 if quick else 2


def tiny_training(report: Report, device: str, quick: bool, folder: Path) -> None:
    """A few steps of `train --format authors` on a tiny Qwen3, over every GPU here, several sequences per forward of
    the head; the head must decode."""
    save_tiny_qwen3(folder / "model")
    write_chats(folder / "chats.jsonl", 40)
    n = training_processes(device, quick)
    launcher = [sys.executable, "-m", "dart_core"] if n == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), "-m", "dart_core"]
    command = [*launcher, "train", "--model", str(folder / "model"), "--chats", str(folder / "chats.jsonl"),
               "--format", "authors", "--out", str(folder / "run"), "--device", "cuda" if device.startswith("cuda")
               else "cpu", "--sharegpt", "0", "--vocab-ngram", "none", "--steps", "4", "--eval-every", "4",
               "--heldout", "4", "--n-mask", "3", "--draft-vocab", "64", "--anchors", "32", "--dtype", "bf16",
               "--accumulate", "3", "--sequence-batch", "2"]   # a forward of two sequences, then one of one
    env = {**os.environ, "DART_CACHE_DIR": str(folder / "cache"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    metrics_file = folder / "run" / "best" / "metrics.json"
    if done.returncode != 0 or not metrics_file.is_file():
        report.check(f"training on {n} process(es)", False, f"exit {done.returncode}: {why_failed(done.stderr)}")
        return
    metrics = json.loads(metrics_file.read_text())
    report.check(f"training on {n} process(es)", metrics["world_size"] == n and metrics["steps"] == 4,
                 f"{metrics['steps']} steps, world size {metrics['world_size']}, head bf16 {metrics['head_bf16']}")
    # the sessions' own minutes: train_minutes is rounded to 0.1, which a run of seconds reads as none
    seconds = 60 * minutes_trained(metrics["sessions"])
    rate = f"{metrics['tokens_seen'] / seconds:.0f}/s" if seconds > 0 else "no time recorded"
    print(f"INFO  training: {metrics['tokens_seen']} anchor tokens in {seconds:.1f} s, {rate} (tiny target, "
          f"{n} process(es), the evaluation included)", flush=True)
    target = TargetModel(AutoModelForCausalLM.from_pretrained(str(folder / "model"), dtype=torch.float32)
                         .to(device).eval())
    head = load_draft(str(folder / "run" / "best"), target)
    proposer = DartProposer(HeadDrafter(head, target), SearchConfig(node_budget=20))
    batch = random_prompts(3, target.vocab_size, seed=5)
    same = sum(run(target, proposer, p, GenerationConfig(max_new_tokens=16)).output_ids ==
               plain_greedy_reference(target, p, 16) for p in batch)
    report.check("trained head (authors' format) lossless", same == len(batch),
                 f"{same}/{len(batch)} prompts token-identical in fp32 (trained for {seconds:.0f} s)")


def default_model(report: Report, device: str, n_prompts: int, max_new_tokens: int) -> bool:
    """DART against plain decoding with the default model, where it is on this machine (False: it is not)."""
    if not (cache_root() / "SmolLM2-135M-Instruct" / "model.safetensors").is_file():
        print(f"NOTE  default model: not on this machine ({cache_root() / 'SmolLM2-135M-Instruct'}); "
              "the default-model comparison did not run", flush=True)
        return False
    loaded = load("default", device=device, dtype="fp32")
    target = loaded.target
    config = GenerationConfig(max_new_tokens=max_new_tokens, stop_ids=loaded.stop_ids)
    try:
        texts = [p.text for p in mtbench_prompts()[:n_prompts]]
    except DatasetError:
        texts = [text for _, text in EXAMPLES[:n_prompts]]
        print(f"NOTE  MT-bench's package is not installed here: {len(texts)} of the project's example prompts "
              "instead", flush=True)
    dart, plain = loaded.proposer("dart", DraftSettings(auto_budget=True)), VanillaProposer()
    run(target, plain, encode_prompt(target.tokenizer, texts[0]), config)   # warm-up (kernels, allocator)
    same, seconds, metrics = 0, {"plain": 0.0, "dart": 0.0}, {"plain": Metrics(), "dart": Metrics()}
    for text in texts:
        ids = encode_prompt(target.tokenizer, text)
        outputs = {}
        for name, proposer in (("plain", plain), ("dart", dart)):
            t = time.perf_counter()
            trace = run(target, proposer, ids, config)
            seconds[name] += time.perf_counter() - t
            outputs[name] = trace.output_ids
            for step in trace.steps:
                metrics[name].observe(step)
        same += outputs["plain"] == outputs["dart"]
    speed = {k: metrics[k].new_tokens / seconds[k] for k in seconds}
    report.check("default model fp32 lossless", same == len(texts),
                 f"{same}/{len(texts)} prompts token-identical to plain decoding")
    print(f"INFO  default model on {device}: plain {speed['plain']:.1f} tok/s, DART {speed['dart']:.1f} tok/s "
          f"({speed['dart'] / speed['plain']:.2f}x, tau {metrics['dart'].tau:.2f}, "
          f"{max_new_tokens} new tokens, {len(texts)} prompts)", flush=True)
    return True


def doc_chats(path: Path, words: int = 250) -> Path:
    """Conversations whose replies are passages of `words` words of the project's docs: real text to train on where
    no data set is installed (a rate needs text of a reply's length, not a data set)."""
    text = " ".join(f.read_text() for f in sorted((ROOT / "docs").glob("*.md"))).split()
    write_jsonl(path, ({"messages": [{"role": "user", "content": "Explain this part of the docs."},
                                     {"role": "assistant", "content": " ".join(text[start:start + words])}]}
                       for start in range(0, len(text) - words, words)))
    return path


def training_rate(report: Report, device: str, model: str, head: str, seconds: float, folder: Path) -> None:
    """`head` trained on with `model` for `seconds`, 8 sequences per step and per forward of the head: anchor tokens
    per second, the target's features and labels computed as it goes (no cache)."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "dart_core", "train", "--model", model, "--init-from", head,
               "--chats", str(doc_chats(folder / "chats.jsonl")), "--sharegpt", "0", "--vocab-ngram", "none",
               "--heldout", "4", "--minutes", f"{seconds / 60:.3f}", "--steps", "1000000", "--eval-every", "1000000",
               "--accumulate", "8", "--sequence-batch", "8", "--feature-batch", "16", "--out", str(folder / "run"),
               "--device", "cuda" if device.startswith("cuda") else "cpu"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 240)
    state = folder / "run" / "ckpt.pt"
    if done.returncode != 0 or not state.is_file():
        report.check("training rate", False, f"exit {done.returncode}: {why_failed(done.stderr)}")
        return
    saved = torch.load(state, weights_only=False, map_location="cpu")
    trained = 60 * minutes_trained(saved["sessions"])
    ok = saved["step"] > 0 and trained > 0
    rate = saved["tokens_seen"] / trained if ok else 0.0
    report.check("training rate", ok, f"{saved['tokens_seen']} anchor tokens in {trained:.1f} s: {rate:.0f} anchor "
                 f"tokens/s ({saved['step']} steps of 8 sequences, the evaluations and saving included)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.gpu_check")
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="fp32 only, fewer prompts, no default model")
    p.add_argument("--prompts", type=int, default=10, help="default-model prompts (MT-bench)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="per default-model prompt")
    p.add_argument("--skip-tiny", action="store_true", help="only the default-model comparison")
    p.add_argument("--skip-training", action="store_true", help="no training check")
    p.add_argument("--train-seconds", type=float, default=45.0, help="the default head's training rate: its time")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: --device {args.device}, but CUDA is not available here", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "CPU"
    print(f"INFO  device {args.device} ({where}), torch {torch.__version__}", flush=True)
    report = Report()
    dtypes = [] if args.skip_tiny else ["fp32"] if args.quick else list(DTYPES)
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in dtypes:
            if dtype == "bf16" and args.device.startswith("cuda") and not torch.cuda.is_bf16_supported():
                print("NOTE  bf16: this GPU has no bf16 support; not run", flush=True)
                continue
            try:
                tiny_lossless(report, args.device, dtype, 3 if args.quick else 8, Path(tmp))
            except (RuntimeError, DartError) as exc:   # a dtype the device cannot run is a failed check, not a crash
                report.check(f"{dtype} runs", False, str(exc).splitlines()[0])
        if not (args.skip_tiny or args.skip_training):
            tiny_training(report, args.device, args.quick, Path(tmp) / "training")
    if not args.quick and default_model(report, args.device, args.prompts, args.max_new_tokens) \
            and not args.skip_training:
        with tempfile.TemporaryDirectory() as tmp:
            training_rate(report, args.device, "default", str(DEFAULT_HEAD), args.train_seconds, Path(tmp))
    print(f"{'ALL CHECKS PASSED' if not report.failed else 'FAILED: ' + ', '.join(report.failed)}", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
