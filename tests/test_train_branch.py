"""A long run's trunk holds its learning rate (warmup-stable-decay, `--decay-steps`) and a branch of it
(`--branch-from`) anneals over its last steps: a head at a schedule's end, a point of the learning curve's fit,
while the trunk goes on untouched."""

import json

import pytest
import torch

from dart_core.tools.cli import main
from dart_core.training import data
from dart_core.training.trainer import TrainConfig, Trainer
from scripts.learning_curve import run_points
from dart_core.setup.tiny_training import save_tiny_qwen3, write_chats


def test_the_rate_holds_until_the_last_decay_steps_then_anneals_to_the_floor(tmp_path):
    target = save_tiny_qwen3(tmp_path / "model")
    seq = data.sequence_example(target, [1, 9, 10, 11], [12, 13, 14, 15, 16, 17])
    cfg = TrainConfig(n_mask=2, draft_vocab=0, max_steps=1000, decay_steps=200, warmup=10, lr=1e-3)
    trainer = Trainer(target, [seq], [seq], cfg, tmp_path / "run")
    assert trainer.lr_at(4) == pytest.approx(5e-4)                          # the warm-up as before
    assert trainer.lr_at(10) == trainer.lr_at(500) == trainer.lr_at(800) == pytest.approx(1e-3)   # held
    assert trainer.lr_at(900) == pytest.approx(5.5e-4)                      # half the decay: half the cosine
    assert trainer.lr_at(1000) == pytest.approx(1e-4)                       # the end: the floor
    cosine = Trainer(target, [seq], [seq], TrainConfig(n_mask=2, draft_vocab=0, max_steps=1000, warmup=10,
                                                       lr=1e-3), tmp_path / "run2")
    assert cosine.lr_at(505) == pytest.approx(5.5e-4)                       # without it: the cosine over all steps


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("branch")
    save_tiny_qwen3(root / "model")
    write_chats(root / "chats.jsonl", 24)
    return root


def train(root, out: str, *extra: str) -> int:
    return main(["train", "--model", str(root / "model"), "--chats", str(root / "chats.jsonl"), "--sharegpt", "0",
                 "--vocab-ngram", "none", "--heldout", "3", "--n-mask", "3", "--draft-vocab", "64", "--anchors", "16",
                 "--dtype", "fp32", "--head-fp32", "--lr", "3e-3", "--eval-every", "4", "--out", str(root / out),
                 *extra])


def test_a_branch_anneals_from_the_trunks_checkpoint_and_leaves_the_trunk_as_it_was(setup, monkeypatch, capsys):
    root = setup
    monkeypatch.setenv("DART_CACHE_DIR", str(root / "cache"))
    assert train(root, "trunk", "--steps", "8", "--decay-steps", "4") == 0
    trunk = root / "trunk" / "ckpt.pt"
    trunk_bytes, at = trunk.read_bytes(), 8

    branch = ["--branch-from", str(root / "trunk"), "--steps", str(at + 6), "--decay-steps", "6"]
    assert train(root, "branch", *branch) == 0
    assert f"[train] branched from {root / 'trunk'} at step {at}" in capsys.readouterr().out
    assert trunk.read_bytes() == trunk_bytes                               # the trunk goes on from where it was
    state = torch.load(root / "branch" / "ckpt.pt", weights_only=False)
    assert state["step"] == at + 6 and state["branched_from"] == {"run": str(root / "trunk"), "step": at}
    saved = {name: json.loads((root / "branch" / name / "metrics.json").read_text())
             for name in ("best", "end") if (root / "branch" / name).is_dir()}
    assert any(m["steps"] == at + 6 for m in saved.values())               # the annealed head is kept, best or not
    assert all(m["train_config"]["decay_steps"] == 6 for name, m in saved.items() if m["steps"] == at + 6)

    points, _ = run_points(root / "branch")                                # only the branch's own evaluations
    assert points and all(p["step"] > at for p in points) and points[-1]["endpoint"]
    assert points[-1]["step"] == at + 6
    assert not any(p["estimated"] for p in points)                         # each evaluation records its tokens
    assert points[-1]["tokens"] == state["tokens_seen"] > points[0]["tokens"]

    assert train(root, "branch", *branch) == 0                             # run again: resumed, not copied again
    out = capsys.readouterr().out
    assert f"resumed at step {at + 6}" in out
    assert torch.load(root / "branch" / "ckpt.pt", weights_only=False)["branched_from"]["step"] == at


def test_bad_schedules_and_branches_are_told_in_one_line(setup, capsys):
    root = setup
    for extra, message in [(["--steps", "10", "--decay-steps", "11"], "--decay-steps 11: it takes 0 to --steps"),
                           (["--decay-steps", "5", "--schedule", "time", "--minutes", "1"], "choose one"),
                           (["--branch-from", str(root / "nowhere")], "no ckpt.pt there"),
                           (["--checkpoint-minutes", "0"], "--checkpoint-minutes 0.0: it takes a time above 0"),
                           (["--sequence-batch", "0"], "--accumulate and --sequence-batch count sequences: 1 or more"),
                           (["--accumulate", "-1"], "--accumulate and --sequence-batch count sequences")]:
        assert train(root, "bad", *extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "Traceback" not in err
