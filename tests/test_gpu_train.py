"""The GPU training run's pieces, on the CPU: files in parts across a remote machine's limits, the data as token ids
(`train-data export`), `train --heldout-file` and `--schedule time`, and `scripts/gpu_train.py` end to end on a
tiny target, whose head must come back whole and decode losslessly."""

import gzip
import json
import random
from argparse import Namespace

import pytest
import torch

from dart_core.decoding import GenerationConfig, run
from dart_core.proposers import DartProposer, HeadDrafter
from dart_core.setup.loading import load_draft
from dart_core.tools.args import CliError
from dart_core.tools.train import split_heldout
from dart_core.training import data, portable
from dart_core.training.trainer import Trainer, TrainConfig
from dart_core.tree_search import SearchConfig
from scripts import device_payload, gpu_train, learning_curve
from dart_core.setup.tiny_models import plain_greedy_reference
from dart_core.setup.tiny_models import random_prompts as prompts
from dart_core.setup.tiny_training import SPECIAL, WORDS, save_tiny_qwen3, word_tokenizer

CONTENT = WORDS[len(SPECIAL):]


def test_a_file_and_a_folder_come_back_whole_from_their_parts(tmp_path):
    rng = random.Random(0)
    blob = tmp_path / "model.gguf"
    blob.write_bytes(bytes(rng.randrange(256) for _ in range(10_000)))
    folder = tmp_path / "head"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"a": 1}')
    (folder / "sub" / "weights.bin").write_bytes(bytes(rng.randrange(256) for _ in range(5_000)))
    (folder / "empty").write_bytes(b"")

    manifest = device_payload.split(blob, tmp_path / "parts", part_mib=3_000 / 2**20)
    assert len(manifest["parts"]) == 4                                  # 3,000-byte parts of 10,000 bytes
    assert device_payload.join(tmp_path / "parts", tmp_path / "joined.gguf").read_bytes() == blob.read_bytes()

    manifest = device_payload.split(folder, tmp_path / "head-parts", part_mib=2_000 / 2**20)
    assert len(manifest["parts"]) == 3                                  # 5,008 bytes in all: files share parts
    back = device_payload.join(tmp_path / "head-parts", tmp_path / "head-back")
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file()) == \
        ["config.json", "empty", "sub/weights.bin"]
    assert (back / "sub" / "weights.bin").read_bytes() == (folder / "sub" / "weights.bin").read_bytes()

    (tmp_path / "parts" / "part02").write_bytes(b"x" * 3_000)             # a damaged part
    with pytest.raises(device_payload.PayloadError, match="do not match its digest"):
        device_payload.join(tmp_path / "parts", tmp_path / "bad.gguf")
    (tmp_path / "parts" / "part03").unlink()                              # a part not carried yet
    with pytest.raises(device_payload.PayloadError, match="lacks part03"):
        device_payload.join(tmp_path / "parts", tmp_path / "bad.gguf")


def test_what_would_not_come_back_from_a_call_is_named(tmp_path):
    out = tmp_path / "OUT"
    (out / "a" / "b" / "c").mkdir(parents=True)
    for i in range(8):
        (out / f"f{i}").write_bytes(b"x")
    assert device_payload.comes_back(out) == []                         # 8 small files come back
    (out / "a" / "b" / "c" / "deep").write_bytes(b"x")
    (out / "big").write_bytes(b"\0" * (17 * 2**20))
    for i in range(3):
        (out / "a" / f"g{i}").write_bytes(b"\0" * (16 * 2**20))
    assert device_payload.comes_back(out) == ["13 files (at most 8 come back)", "big: 17.0 MiB (at most 16)",
                                              "a/b/c/deep: too deep", "65.0 MiB in all (at most 64)"]


@pytest.fixture
def sharegpt(monkeypatch, tmp_path):
    """80 ShareGPT conversations for the tiny word tokenizer, and a library of 10 documented functions."""
    rng = random.Random(4)

    def text(low, high):
        return " ".join(rng.choice(CONTENT) for _ in range(rng.randint(low, high)))
    convs = [[{"role": "user", "content": text(3, 8)}, {"role": "assistant", "content": text(12, 30)}]
             for _ in range(80)]
    monkeypatch.setattr(data, "iter_sharegpt", lambda: iter(convs))
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "mod.py").write_text("".join(f'def f{i}(x):\n    """w{i} w{i + 1}"""\n    return x + {i}\n\n'
                                        for i in range(10)))
    real = data.fixed_heldout
    monkeypatch.setattr(portable, "fixed_heldout", lambda t, m, thinking=False: real(
        t, m, chat=6, code=2, thinking=thinking, stdlib_root=lib))
    real_code = data.stdlib_code_sequences
    monkeypatch.setattr(portable, "stdlib_code_sequences", lambda t, n, m, thinking=False: real_code(
        t, n, m, thinking=thinking, root=lib))
    return convs


def test_the_export_keeps_the_fixed_heldout_set_apart_and_travels_as_ids(sharegpt, tmp_path):
    tok = word_tokenizer()
    done = portable.export(tok, tmp_path / "export", sharegpt=30, code=10, prompts=20, max_tokens=64, seed=0)
    folder = tmp_path / "export"
    heldout = portable.read_records(folder / portable.HELDOUT, len(tok))
    text = portable.read_records(folder / portable.TEXT, len(tok))
    asked = portable.read_records(folder / portable.PROMPTS, len(tok), need_response=False)
    assert (done["heldout"], done["text"], done["prompts"]) == (len(heldout), len(text), len(asked)) == (8, 38, 20)
    assert heldout == portable.fixed_heldout(tok, 64)          # the very set `--heldout-set fixed` makes here
    held = {data.same_source(r["id"]) for r in heldout}
    assert not held & {data.same_source(r["id"]) for r in text + asked}
    assert not {r["id"] for r in asked} & {data.same_source(r["id"]) for r in text}   # the target answers others
    assert gzip.decompress((folder / portable.TEXT).read_bytes())                      # gzipped as named
    assert json.loads((folder / portable.MANIFEST).read_text())["bytes"][portable.TEXT] > 0

    # a held-out file keeps its records, and every record of their sources, out of training
    args = Namespace(heldout_set="random", heldout=48, max_tokens=64, thinking=False)
    answered = [{**r, "id": r["id"].replace("sharegpt-text/", "sharegpt/")} for r in heldout[:3]]
    kept, train = split_heldout(text + answered, args, tok, given=heldout)
    assert kept == heldout and train == text

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "prompt_ids": [1, 2], "response_ids": [3, len(tok) + 5]}) + "\n")
    with pytest.raises(portable.PortableDataError, match="bad.jsonl:1: token ids outside"):
        portable.read_records(bad, len(tok))


def test_a_time_schedule_anneals_at_the_time_limit_whatever_the_steps(tmp_path):
    target = save_tiny_qwen3(tmp_path / "model")
    seq = data.sequence_example(target, [1, 9, 10, 11], [12, 13, 14, 15, 16, 17])
    cfg = TrainConfig(n_mask=2, draft_vocab=0, max_steps=1_000_000, warmup=10, lr=1e-3, minutes=5.0,
                      schedule="time")
    trainer = Trainer(target, [seq], [seq], cfg, tmp_path / "run")
    assert trainer.lr_at(5, 0.0) == pytest.approx(6e-4)                   # warm-up goes by steps
    assert trainer.lr_at(50, 0.0) == pytest.approx(1e-3, rel=1e-3)
    assert trainer.lr_at(50, 0.5) == pytest.approx(5.5e-4)                 # half the time: half the cosine
    assert trainer.lr_at(50, 1.2) == pytest.approx(1e-4)                   # past the limit: the floor
    steps_only = Trainer(target, [seq], [seq], TrainConfig(n_mask=2, draft_vocab=0, max_steps=1_000_000, warmup=10,
                                                            lr=1e-3, minutes=5.0), tmp_path / "run2")
    assert steps_only.lr_at(50, 0.5) == pytest.approx(1e-3, rel=1e-3)      # a step schedule ignores the time


def test_the_gpu_training_run_brings_back_a_head_that_decodes_losslessly(sharegpt, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    target = save_tiny_qwen3(tmp_path / "model")
    portable.export(word_tokenizer(), tmp_path / "export", sharegpt=40, code=0, prompts=12, max_tokens=64, seed=0)
    out = tmp_path / "OUT"
    code = gpu_train.main(["--model", str(tmp_path / "model"), "--data", str(tmp_path / "export"),
                           "--device", "cpu", "--dtype", "fp32", "--generate-seconds", "60", "--generate-limit", "6",
                           "--generate-batch", "3", "--max-new-tokens", "10", "--seconds", "40",
                           "--reserve-seconds", "22",
                           "--eval-every", "3", "--work", str(tmp_path / "work"), "--out", str(out), "--",
                           "--draft-vocab", "0", "--n-mask", "3", "--anchors", "16", "--dtype", "fp32"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generation"]["responses"] == 6 and summary["training"]["anchor_tokens"] > 0
    assert "--schedule time" in summary["train_command"] and "--heldout-file" in summary["train_command"]
    assert "--feature-batch auto" in summary["train_command"]       # measured there: 16 per forward against 1
    assert "--accumulate 8 --sequence-batch 8" in summary["train_command"]   # eight sequences in one head forward
    assert summary["training"]["features_and_labels"].startswith(("16 sequence(s) per forward", "1 sequence(s)"))
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.pt", "head", "summary.json", "train.log"]
    assert device_payload.comes_back(out) == []

    run_dir = tmp_path / "back"                      # as it is rebuilt here from what the call brought back
    device_payload.join(out / "head", run_dir / "best")
    (run_dir / "ckpt.pt").write_bytes((out / "ckpt.pt").read_bytes())
    assert "head" not in torch.load(run_dir / "ckpt.pt", weights_only=False)   # no weights travel twice
    metrics = json.loads((run_dir / "best" / "metrics.json").read_text())
    assert metrics["data"]["heldout_set"].startswith("file:") and metrics["data"]["heldout_sequences"] == 8
    assert (metrics["train_config"]["accumulate"], metrics["train_config"]["sequence_batch"]) == (8, 8)
    points, _ = learning_curve.run_points(run_dir)
    assert points[-1]["endpoint"]                    # annealed at its time limit: a point the fit reads

    head = load_draft(str(run_dir / "best"), target)
    proposer = DartProposer(HeadDrafter(head, target), SearchConfig(node_budget=12))
    for p in prompts(3, target.vocab_size, seed=2):
        assert run(target, proposer, p, GenerationConfig(max_new_tokens=16)).output_ids == \
            plain_greedy_reference(target, p, 16)


def test_a_schedule_by_time_needs_a_time_limit(tmp_path):
    from dart_core.tools.cli import main
    assert main(["train", "--model", str(tmp_path), "--out", str(tmp_path / "run"), "--schedule", "time"]) == 2
    with pytest.raises(CliError):
        from dart_core.tools.train import cmd_train
        cmd_train(Namespace(schedule="time", minutes=0.0))


def test_held_files_leave_the_calls_payload_and_come_back_as_committed(tmp_path):
    import subprocess

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "big.bin").write_bytes(b"b" * 300_000)
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "start")
    before = device_payload.travelling_bytes(tmp_path, [])["working tree"]

    assert device_payload.hold(tmp_path, ["assets/big.bin"]) == ["assets/big.bin"]
    assert (tmp_path / "assets" / "big.bin").is_file()                       # still on disk
    assert device_payload.travelling_bytes(tmp_path, [])["working tree"] == before - 300_000
    assert "big.bin" not in git("status", "--porcelain", "--untracked-files=all").replace("D  assets/big.bin", "")
    with pytest.raises(device_payload.PayloadError, match="not tracked"):
        device_payload.hold(tmp_path, ["nothing.txt"])

    assert device_payload.release(tmp_path) == ["assets/big.bin"]
    assert git("status", "--porcelain") == ""                                 # as committed, nothing ignored
    assert device_payload.travelling_bytes(tmp_path, [])["working tree"] == before
    assert device_payload.release(tmp_path) == []


def test_a_gguf_file_converts_once_into_a_folder_named_as_its_model(tmp_path, monkeypatch):
    from dart_core.setup import models
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "parts-joined" / "Tiny-Model.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    converted = []

    def convert(source, out):            # stands in for the dequantization (tests/test_default_model.py runs it)
        converted.append(source)
        save_tiny_qwen3(out)
        return out
    monkeypatch.setattr(models, "converted_gguf", convert)
    first = models.resolve_model_path(str(gguf))
    assert models.resolve_model_path(str(gguf)) == first and converted == [gguf]    # the cache is read back
    assert first.endswith("/Tiny-Model")  # as a head names its target: a head for the model fits the GGUF copy
    gguf.write_bytes(gguf.read_bytes() + b"changed")
    assert models.resolve_model_path(str(gguf)) != first and len(converted) == 2
    other = tmp_path / "notes.txt"
    other.write_text("x")
    with pytest.raises(models.ModelLoadError, match="folder or a .gguf file"):
        models.resolve_model_path(str(other))


def test_generation_stops_at_its_time_limit_with_the_answers_cut_there(sharegpt, tmp_path):
    target = save_tiny_qwen3(tmp_path / "model")
    tok = word_tokenizer()
    asked = [(f"p/{i}", tok.encode(" ".join(CONTENT[i: i + 5]))) for i in range(6)]
    out = tmp_path / "own.jsonl"
    n = data.generate_responses(target.model, tok, out, data.ResponseSettings(limit=6, batch_size=2, max_new_tokens=20,
                                                                              seconds=1e-6), asked)
    records = data.read_jsonl(out)
    assert n == len(records) == 2                     # the first batch, then the limit had passed
    for r in records:                                  # as far as it got: a prefix of the target's own answer
        reference = plain_greedy_reference(target, r["prompt_ids"], 20)
        assert 0 < len(r["response_ids"]) <= 20 and r["response_ids"] == reference[: len(r["response_ids"])]


def test_a_generation_cut_by_its_limit_answered_prompts_from_the_start_of_the_order_not_the_shortest(sharegpt,
                                                                                                     tmp_path):
    target = save_tiny_qwen3(tmp_path / "model")
    tok = word_tokenizer()
    # 40 prompts, longest first; the shortest are at the end of the fixed order
    asked = [(f"p/{i}", tok.encode(" ".join(CONTENT[:12 - i // 4]))) for i in range(40)]
    out = tmp_path / "own.jsonl"
    data.generate_responses(target.model, tok, out, data.ResponseSettings(limit=40, batch_size=2, max_new_tokens=3,
                                                                          seconds=1e-6), asked)
    window = [pid for pid, _ in asked[:2 * data.LENGTH_SORT_BATCHES]]
    (first, second) = [r["id"] for r in data.read_jsonl(out)]
    assert {first, second} <= set(window)            # the shortest of the first window, not of all 40
    assert len(dict(asked)[first]) == min(len(ids) for pid, ids in asked if pid in window)


def test_the_run_counts_its_seconds_from_the_scripts_start(monkeypatch):
    import time
    monkeypatch.setenv("GPU_TRAIN_STARTED", str(time.time() - 30))   # gpu-train.sh's clock, wheels installed since
    assert 29 < gpu_train.spent_before_python() < 40
    monkeypatch.delenv("GPU_TRAIN_STARTED")                          # run as a module: Python's own start
    assert gpu_train.spent_before_python() == 0.0
