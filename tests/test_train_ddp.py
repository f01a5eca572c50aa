"""Data-parallel training: `torchrun --standalone --nproc_per_node 2 -m dart_core train` (two processes over gloo,
each with its own copy of the target and its own half of every step's sequences) reaches the same head as one
process with the same global batch (with their features computed two sequences per forward), and a run resumes
with another number of processes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dart_core.setup.tiny_training import save_tiny_qwen3, write_chats

ROOT = Path(__file__).resolve().parent.parent
# Measured: 5e-6 at most after 3 steps (the gradients summed in another order); the weights move about 1e-2.
TOLERANCE = 1e-4


def train(root: Path, out: str, processes: int, *extra: str) -> subprocess.CompletedProcess:
    args = ["--model", str(root / "model"), "--format", "authors", "--chats", str(root / "chats.jsonl"),
            "--sharegpt", "0", "--vocab-ngram", "none", "--eval-every", "100", "--heldout", "3", "--n-mask", "3",
            "--draft-vocab", "64", "--anchors", "16", "--dtype", "fp32", "--head-fp32", "--lr", "3e-3",
            "--out", str(root / out), *extra]
    launcher = [sys.executable, "-m", "dart_core"] if processes == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
         "-m", "dart_core"]
    env = {**os.environ, "DART_CACHE_DIR": str(root / "cache"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([*launcher, "train", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    target = save_tiny_qwen3(root / "model")
    write_chats(root / "chats.jsonl", 30)
    train(root, "one", 1, "--steps", "3", "--accumulate", "4")   # first: it measures the kernels for both
    # each process computes its 2 sequences of a step in one padded target forward: the same head all the same
    done = train(root, "two", 2, "--steps", "3", "--accumulate", "2", "--feature-batch", "2")
    assert "[train] features and labels: 2 sequence(s) per forward" in done.stdout
    return target, root


def checkpoint(root: Path, out: str) -> dict:
    return torch.load(root / out / "ckpt.pt", weights_only=False)


def test_two_processes_reach_the_weights_of_one_with_the_same_global_batch(runs):
    target, root = runs
    one, two = checkpoint(root, "one"), checkpoint(root, "two")
    assert (one["step"], one["sequences_seen"]) == (two["step"], two["sequences_seen"]) == (3, 12)
    assert one["tokens_seen"] == two["tokens_seen"] > 0      # the same anchors, wherever they were trained
    for key, weight in one["head"].items():
        assert (weight.float() - two["head"][key].float()).abs().max() <= TOLERANCE, key
    # and the weights did move: the tolerance is far below one step's change
    start = target.lm_head.weight[one["head"]["d2t"]] * target.model.model.norm.weight[None]
    assert (one["head"]["lm_head.weight"] - start).abs().max() > 20 * TOLERANCE
    metrics = json.loads((root / "two" / "best" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["command"].startswith("torchrun --nproc_per_node 2 -m dart_core")
    assert (root / "two" / "best" / "config.json").is_file()


def test_a_run_of_two_processes_resumes_in_one(runs):
    _, root = runs
    shutil.copytree(root / "two", root / "resumed")   # the first test reads "two" as two processes left it
    before = checkpoint(root, "resumed")
    done = train(root, "resumed", 1, "--steps", "4", "--accumulate", "4", "--resume")
    assert "resumed at step 3 (12 sequences seen)" in done.stdout
    after = checkpoint(root, "resumed")
    assert (after["step"], after["sequences_seen"]) == (4, 16)
    assert [s["world_size"] for s in after["sessions"]] == [2, 1]
    assert (after["head"]["fc.weight"] - before["head"]["fc.weight"]).abs().max() > 0
