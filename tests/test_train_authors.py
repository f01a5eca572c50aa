"""`train --format authors` on a tiny Qwen3 target: OUT/best/ holds every weight the DART authors' model reads, under
their names; their forward (tests/authors_format.py, written from their code) drafts exactly what the trained head
drafted and what this project drafts with the files; greedy DART with it stays token-identical to plain decoding."""

import json

import pytest
import torch

from dart_core.decoding import GenerationConfig, run
from dart_core.draft_head import DraftConfig, DraftHead
from dart_core.proposers import DartProposer, HeadDrafter
from dart_core.setup.loading import load_draft
from dart_core.setup.tiny_models import plain_greedy_reference
from dart_core.tools.cli import main
from dart_core.tree_search import SearchConfig
from tests.authors_format import THEIR_KEYS, read_authors_head, their_draft, their_features
from dart_core.setup.tiny_models import random_prompts as prompts
from dart_core.setup.tiny_training import save_tiny_qwen3, write_chats

STEPS = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target, run folder): a head trained for a few steps and evaluated once, at the end, so best/ is the
    checkpoint's head."""
    root = tmp_path_factory.mktemp("authors")
    target = save_tiny_qwen3(root / "model")
    chats = write_chats(root / "chats.jsonl", 30)
    argv = ["train", "--model", str(root / "model"), "--format", "authors", "--out", str(root / "out"),
            "--chats", str(chats), "--sharegpt", "0", "--vocab-ngram", "none", "--dtype", "fp32",
            "--steps", str(STEPS), "--eval-every", "100", "--heldout", "3", "--n-mask", "3",
            "--draft-vocab", "64", "--anchors", "16", "--lr", "3e-3"]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("DART_CACHE_DIR", str(root / "cache"))
        m.setattr("sys.argv", ["dart_core", *argv])   # as typed: the command metrics.json records
        assert main(argv) == 0
    return target, root / "out"


def _checkpoint_head(target, out) -> DraftHead:
    """The trained head as the trainer held it (our single-file state, feature scales not folded)."""
    cfg = DraftConfig.for_target(target.config, n_mask=3, tie_output=False, draft_vocab_size=64,
                                 standardize_features=True, double_norm=True)
    head = DraftHead(cfg)
    head.load_state_dict(torch.load(out / "ckpt.pt", weights_only=False)["head"])
    return head.eval()


def test_the_files_hold_every_weight_their_model_reads(trained):
    _, out = trained
    files = read_authors_head(out / "best")
    assert set(files["state"]) == THEIR_KEYS   # all of their layer's weights, nothing else (no embedding)
    config = files["config"]
    assert config["draft_length"] == 3 and config["draft_vocab_size"] == 64 and config["model_type"] == "llama"
    assert config["hidden_size"] == 64 and config["num_key_value_heads"] == 2 and config["rope_scaling"] is None
    assert files["state"]["d2t"].dtype == torch.int64 and files["state"]["t2d"].dtype == torch.bool
    assert int(files["state"]["t2d"].sum()) == 64
    metrics = json.loads((out / "best" / "metrics.json").read_text())
    assert metrics["format"] == "authors" and metrics["steps"] == STEPS and metrics["world_size"] == 1
    assert metrics["target"]["model_type"] == "qwen3" and metrics["command"].startswith("python -m dart_core train --model")
    (source, counts), = metrics["data"]["sources"].items()
    assert source.startswith("chats:") and counts["conversations"] == 30 and counts["records"] > 30


def test_their_forward_drafts_what_the_trained_head_and_our_loader_draft(trained):
    target, out = trained
    files = read_authors_head(out / "best")
    ours = HeadDrafter(load_draft(str(out / "best"), target), target)
    trained_head = HeadDrafter(_checkpoint_head(target, out), target)
    prompt, root = [9, 17, 33, 8, 61, 12, 40, 23], 30
    feats = their_features(target, prompt)
    embeds = target.embed_tokens(torch.tensor(prompt[1:] + [root]))
    want, target_ids, past = their_draft(files, feats, embeds)
    for drafter in (ours, trained_head):
        got = drafter.draft(prompt + [root], feats)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert torch.equal(drafter.target_ids(torch.arange(64)), target_ids)
    # a later step, on their draft cache and ours
    accepted, nxt = [44, 45], 50
    new_feats = their_features(target, prompt + [root] + accepted)[len(prompt):]
    embeds = target.embed_tokens(torch.tensor(accepted + [nxt]))
    want, _, _ = their_draft(files, new_feats, embeds, past)
    for drafter in (ours, trained_head):
        got = drafter.draft(prompt + [root] + accepted + [nxt], new_feats)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_greedy_dart_with_the_trained_head_is_lossless(trained, one_thread):
    target, out = trained
    head = load_draft(str(out / "best"), target)
    proposer = DartProposer(HeadDrafter(head, target), SearchConfig(node_budget=20))
    for prompt in prompts(6, target.vocab_size, seed=9):
        trace = run(target, proposer, prompt, GenerationConfig(max_new_tokens=20))
        assert trace.output_ids == plain_greedy_reference(target, prompt, 20)
        assert all(len(s.tree) > 1 for s in trace.steps[1:])   # the head drafted at every step
