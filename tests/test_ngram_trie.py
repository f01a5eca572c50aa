"""The DART authors' .trie n-gram files: reading, writing, checks on broken files, `ngram convert`, `--ngram x.trie`.

The trie files here come from a writer of this test's own, built from token streams with dicts the way their
`add_conversation` builds it: for every start s, tokens[s:s+order] is inserted and every node on the path, the root
included, counts one more. Their `add_all` (merging part files) and `reduce` (pruning rare nodes) are modelled too:
node ids in creation order, new nodes appended depth-first, the root's token left 0."""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest

from dart_core.ngram import UNSEEN, NGramError, NGramModel
from dart_core.formats.ngram_trie import read_trie, write_trie
from dart_core.tools.cli import main

VOCAB = 12


class RefTrie:
    """The authors' trie, in python dicts: node = [token, parent, freq, {child token: child id}]."""

    def __init__(self, order: int):
        self.order = order
        self.nodes = [[0, 0, 0, {}]]

    def add(self, tokens):
        for s in range(len(tokens)):
            node = 0
            self.nodes[0][2] += 1
            for t in tokens[s: s + self.order]:
                kids = self.nodes[node][3]
                if t not in kids:
                    kids[t] = len(self.nodes)
                    self.nodes.append([t, node, 0, {}])
                node = kids[t]
                self.nodes[node][2] += 1
        return self

    def _new_child(self, node, token):
        self.nodes[node][3][token] = len(self.nodes)
        self.nodes.append([token, node, 0, {}])
        return len(self.nodes) - 1

    def merge(self, other: "RefTrie", node=0, theirs=0):
        """Their add_all: add other's freqs node by node; nodes only other has are appended depth-first."""
        self.nodes[node][2] += other.nodes[theirs][2]
        for t, child in other.nodes[theirs][3].items():
            mine = self.nodes[node][3].get(t)
            self.merge(other, self._new_child(node, t) if mine is None else mine, child)
        return self

    def reduce(self, threshold: int) -> "RefTrie":
        """Their reduce: a new trie keeping the nodes with freq >= threshold (depth-first); each kept node's freq
        drops by everything pruned at or below its children, and the new root starts at 0, so it ends negative."""
        out = RefTrie(self.order)

        def walk(node, new):
            pruned = 0
            for t, child in self.nodes[node][3].items():
                if self.nodes[child][2] >= threshold:
                    kept = out._new_child(new, t)
                    out.nodes[kept][2] = self.nodes[child][2]
                    pruned += walk(child, kept)
                else:
                    pruned += self.nodes[child][2]
            out.nodes[new][2] -= pruned
            return pruned

        walk(0, 0)
        return out

    def prob(self, context, token):
        """Their query: the longest suffix first; a suffix never seen is skipped; no unigram level. A child that
        exists answers even with freq 0 (reduced tries); over a context of freq 0 their float division gives nan."""
        for length in range(min(self.order - 1, len(context)), 0, -1):
            node = 0
            for t in context[-length:]:
                node = self.nodes[node][3].get(t)
                if node is None:
                    break
            if node is None:
                continue
            child = self.nodes[node][3].get(token)
            if child is not None:
                num, den = self.nodes[child][2], self.nodes[node][2]
                return (num / den if den else float("nan")), length
        return 0.0, UNSEEN

    def to_bytes(self, shuffle_seed: int | None = None, order: int | None = None) -> bytes:
        """The file; shuffle_seed renumbers the non-root nodes at random (parents then often come after children)."""
        n = len(self.nodes)
        new = list(range(n))
        if shuffle_seed is not None:
            rest = new[1:]
            random.Random(shuffle_seed).shuffle(rest)
            new = [0] + rest
        by_new = sorted(range(n), key=lambda i: new[i])
        out = [struct.pack("<QQ", self.order if order is None else order, n)]
        for i in by_new:
            token, parent, freq, kids = self.nodes[i]
            out.append(struct.pack("<iQiQ", token, new[parent], freq, len(kids)))
            out.extend(struct.pack("<iQ", t, new[c]) for t, c in kids.items())
        return b"".join(out)


def streams(seed=0, count=30, vocab=VOCAB):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(1, 60))] for _ in range(count)]


def ref_trie(order, data):
    trie = RefTrie(order)
    for s in data:
        trie.add(s)
    return trie


def same(a: NGramModel, b: NGramModel) -> bool:
    return (a.order, a.vocab_size) == (b.order, b.vocab_size) and all(
        np.array_equal(x, y) for x, y in zip(a.keys + a.counts, b.keys + b.counts))


def write(tmp_path, data: bytes, name="t.trie"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------------------------------- reading
@pytest.mark.parametrize("order", [2, 3, 4])
def test_probabilities_match_their_query_and_our_build(tmp_path, order):
    data = streams(order)
    trie = ref_trie(order, data)
    model = read_trie(write(tmp_path, trie.to_bytes()), vocab_size=VOCAB)
    assert same(model, NGramModel.build(data, VOCAB, order))
    rng = random.Random(order)
    for _ in range(300):
        ctx = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, order + 2))]
        toks = [rng.randrange(VOCAB) for _ in range(6)]
        p, matched = model.prob(ctx, toks)
        for t, pi, mi in zip(toks, p, matched):
            ep, em = trie.prob(ctx, t)
            assert pi == pytest.approx(ep) and mi == em


def test_shuffled_node_order_reads_the_same(tmp_path):
    trie = ref_trie(3, streams(5))
    plain = read_trie(write(tmp_path, trie.to_bytes(), "a.trie"))
    for seed in range(3):
        assert same(read_trie(write(tmp_path, trie.to_bytes(shuffle_seed=seed), "b.trie")), plain)
    assert plain.vocab_size == max(t for s in streams(5) for t in s) + 1   # no vocab given: the largest token + 1


def test_merged_part_files_read_as_one_count(tmp_path):
    """ngram_build.py counts parts in parallel and merges them with add_all: the same counts, other node ids."""
    data = streams(21, vocab=VOCAB)
    merged = ref_trie(3, data[:10]).merge(ref_trie(3, data[10:20])).merge(ref_trie(3, data[20:]))
    model = read_trie(write(tmp_path, merged.to_bytes()), vocab_size=VOCAB)
    assert same(model, NGramModel.build(data, VOCAB, 3))


@pytest.mark.parametrize("order", [3, 4])
def test_reduced_tries_read_with_their_freqs(tmp_path, order):
    """A reduced trie (their small files): the root's freq is negative and is not read; every other freq is taken
    as it is, so the probabilities are their query's. Where a kept node's freq dropped to 0, theirs answers 0 (or
    nan over a context of freq 0) at that length and stops; ours finds no count there and goes on to shorter
    contexts, so the matched length (and, from order 4, the probability) may differ; those cases are skipped."""
    data = streams(30 + order, count=60, vocab=VOCAB)
    reduced = ref_trie(order, data).reduce(threshold=3)
    assert reduced.nodes[0][2] < 0
    model = read_trie(write(tmp_path, reduced.to_bytes(shuffle_seed=order)), vocab_size=VOCAB)
    rng = random.Random(order)
    compared = 0
    for _ in range(400):
        ctx = [rng.randrange(VOCAB) for _ in range(order - 1)]
        toks = [rng.randrange(VOCAB) for _ in range(6)]
        p, matched = model.prob(ctx, toks)
        for t, pi, mi in zip(toks, p, matched):
            ep, em = reduced.prob(ctx, t)
            if ep > 0:
                assert pi == pytest.approx(ep) and mi == em
                compared += 1
    assert compared > 100


def test_small_chunks_and_big_records(tmp_path, monkeypatch):
    """A record larger than the read buffer (the root's child list) and many buffer refills."""
    import dart_core.formats.ngram_trie as nt
    monkeypatch.setattr(nt, "CHUNK_BYTES", 64)
    data = streams(7, count=20, vocab=300)
    path = write(tmp_path, ref_trie(3, data).to_bytes(shuffle_seed=1))
    assert same(read_trie(path, vocab_size=300, progress=True), NGramModel.build(data, 300, 3))


def test_round_trips(tmp_path):
    data = streams(9, vocab=50)
    model = NGramModel.build(data, 50, 3)
    npz, trie_path = tmp_path / "a.npz", tmp_path / "a.trie"
    model.save(npz)
    write_trie(NGramModel.load(npz), trie_path)
    assert same(read_trie(trie_path, vocab_size=50), model)                   # npz -> trie -> npz
    theirs = write(tmp_path, ref_trie(3, data).to_bytes(shuffle_seed=4), "theirs.trie")
    write_trie(read_trie(theirs, vocab_size=50), tmp_path / "again.trie")
    once = (tmp_path / "again.trie").read_bytes()
    write_trie(read_trie(tmp_path / "again.trie", vocab_size=50), tmp_path / "twice.trie")
    assert (tmp_path / "twice.trie").read_bytes() == once                    # trie -> npz -> trie
    assert same(read_trie(tmp_path / "again.trie", vocab_size=50), model)


def test_written_file_layout(tmp_path):
    """BFS ids, children in token order, root freq = number of tokens: checked field by field."""
    model = NGramModel.build([[3, 1, 3]], vocab_size=4, order=2)
    path = tmp_path / "t.trie"
    write_trie(model, path)
    raw = path.read_bytes()
    assert struct.unpack_from("<QQ", raw) == (2, 5)      # root, 1-grams 1 and 3, 2-grams (1,3) and (3,1)
    at = 16
    nodes = []
    for _ in range(5):
        tok, parent, freq, nc = struct.unpack_from("<iQiQ", raw, at)
        kids = [struct.unpack_from("<iQ", raw, at + 24 + 12 * j) for j in range(nc)]
        nodes.append((tok, parent, freq, kids))
        at += 24 + 12 * nc
    assert at == len(raw)
    assert nodes == [(0, 0, 3, [(1, 1), (3, 2)]), (1, 0, 1, [(3, 3)]), (3, 0, 2, [(1, 4)]), (3, 1, 1, []),
                     (1, 2, 1, [])]


def test_a_root_freq_past_int32_wraps_as_theirs_would(tmp_path):
    """The root's freq (the number of tokens) is read by neither query; past 2**31 it is written wrapped, as their
    int32 counter holds it, and such a file (like one of theirs) still reads."""
    big = 2**30
    model = NGramModel(2, 4, [np.asarray([1, 2, 3], np.uint64), np.asarray([(1 << 2) | 2], np.uint64)],
                       [np.asarray([big, big, big]), np.asarray([big])])
    write_trie(model, tmp_path / "big.trie")
    assert struct.unpack_from("<i", (tmp_path / "big.trie").read_bytes(), 16 + 12)[0] == 3 * big - 2**32
    assert same(read_trie(tmp_path / "big.trie", vocab_size=4), model)


def test_empty_table(tmp_path):
    model = NGramModel.build([], vocab_size=8, order=3)
    write_trie(model, tmp_path / "e.trie")
    assert same(read_trie(tmp_path / "e.trie", vocab_size=8), model)


# ---------------------------------------------------------------------------------------------------- broken files
def good_bytes():
    return bytearray(ref_trie(3, [[1, 2, 3, 1, 2], [4, 2]]).to_bytes())


def node_offsets(raw):
    n = struct.unpack_from("<Q", raw, 8)[0]
    at, out = 16, []
    for _ in range(n):
        out.append(at)
        at += 24 + 12 * struct.unpack_from("<Q", raw, at + 16)[0]
    return out


def expect_error(tmp_path, raw, *words, vocab_size=None):
    with pytest.raises(NGramError) as err:
        read_trie(write(tmp_path, bytes(raw), "bad.trie"), vocab_size=vocab_size)
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def test_too_short_and_truncated(tmp_path):
    raw = good_bytes()
    expect_error(tmp_path, raw[:10], "too short")
    expect_error(tmp_path, raw[:16], "node_count does not match the file size")
    last = node_offsets(raw)[-1]
    n = len(node_offsets(raw))
    expect_error(tmp_path, raw[:-5], f"truncated at node {n - 1} of {n}")
    expect_error(tmp_path, raw[: last + 3], f"truncated at node {n - 1}")


def test_bad_header(tmp_path):
    raw = good_bytes()
    for order in (0, 1, 1000):
        struct.pack_into("<Q", raw, 0, order)
        expect_error(tmp_path, raw, f"header order {order}")
    raw = good_bytes()
    n = struct.unpack_from("<Q", raw, 8)[0]
    struct.pack_into("<Q", raw, 8, 10 * n)
    expect_error(tmp_path, raw, "node_count does not match the file size")
    struct.pack_into("<Q", raw, 8, n - 1)
    expect_error(tmp_path, raw, "trailing bytes", "node_count")
    struct.pack_into("<Q", raw, 8, 0)
    expect_error(tmp_path, raw, "0 nodes")


def test_trailing_bytes(tmp_path):
    expect_error(tmp_path, good_bytes() + b"\0\0\0\0", "4 trailing bytes")
    expect_error(tmp_path, good_bytes() + b"\1", "1 trailing bytes")


def test_bad_parent_and_inconsistent_child_lists(tmp_path):
    raw = good_bytes()
    offs = node_offsets(raw)
    struct.pack_into("<Q", raw, offs[3] + 4, 999)
    expect_error(tmp_path, raw, "node 3 has parent 999, outside")
    raw = good_bytes()
    struct.pack_into("<Q", raw, offs[3] + 4, 2 if struct.unpack_from("<Q", raw, offs[3] + 4)[0] != 2 else 1)
    expect_error(tmp_path, raw, "inconsistent child list")
    raw = good_bytes()
    struct.pack_into("<i", raw, offs[0] + 24, 11)        # the root lists its first child under another token
    expect_error(tmp_path, raw, "token 11", "inconsistent child list")
    raw = good_bytes()
    struct.pack_into("<Q", raw, offs[0] + 24 + 4, 12345)   # a child id out of range
    expect_error(tmp_path, raw, "names node 12345, outside")
    raw = good_bytes()
    first, second = struct.unpack_from("<iQ", raw, offs[0] + 24), struct.unpack_from("<iQ", raw, offs[0] + 36)
    struct.pack_into("<iQ", raw, offs[0] + 36, *first)     # the first child listed twice, the second not at all
    expect_error(tmp_path, raw, "inconsistent child list")
    assert second != first


def test_negative_freq_tokens_and_depth(tmp_path):
    raw = good_bytes()
    offs = node_offsets(raw)
    struct.pack_into("<i", raw, offs[2] + 12, -3)
    expect_error(tmp_path, raw, "node 2 has a negative freq")
    expect_error(tmp_path, good_bytes(), "outside the vocabulary of 3", vocab_size=3)
    deep = ref_trie(3, [[1, 2, 3, 1]]).to_bytes(order=2)
    expect_error(tmp_path, deep, "depth 3, deeper than the order 2")


def test_parent_cycle(tmp_path):
    # root without children; nodes 1 and 2 each other's parent and child: sizes and lists agree, the root is cut off
    raw = struct.pack("<QQ", 3, 3) + struct.pack("<iQiQ", 0, 0, 2, 0)
    raw += struct.pack("<iQiQ", 5, 2, 1, 1) + struct.pack("<iQ", 6, 2)
    raw += struct.pack("<iQiQ", 6, 1, 1, 1) + struct.pack("<iQ", 5, 1)
    expect_error(tmp_path, raw, "not reachable from the root")


def test_missing_file(tmp_path):
    with pytest.raises(NGramError, match="not found"):
        read_trie(tmp_path / "nope.trie")


# ---------------------------------------------------------------------------------------------------- the command
def test_cli_convert_both_ways(tmp_path, capsys):
    data = streams(11, vocab=40)
    theirs = write(tmp_path, ref_trie(3, data).to_bytes(shuffle_seed=2), "theirs.trie")
    npz = tmp_path / "ours.npz"
    assert main(["ngram", "convert", str(theirs), str(npz), "--vocab-size", "40", "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["vocab_size"] == 40 and summary["bytes"] == npz.stat().st_size
    assert same(NGramModel.load(npz), NGramModel.build(data, 40, 3))
    back = tmp_path / "back.trie"
    assert main(["ngram", "convert", str(npz), str(back), "--no-progress"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert same(read_trie(back, vocab_size=40), NGramModel.build(data, 40, 3))


def test_cli_bad_input_one_line(tmp_path, capsys):
    bad = write(tmp_path, bytes(good_bytes()[:-5]), "bad.trie")
    assert main(["ngram", "convert", str(bad), str(tmp_path / "o.npz"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "truncated" in err[0]
    assert not (tmp_path / "o.npz").exists()
    assert main(["ngram", "convert", str(bad), str(tmp_path / "o.txt")]) == 2
    assert "use a .npz" in capsys.readouterr().err
    assert main(["ngram", "convert", str(bad), str(tmp_path / "o.trie")]) == 2
    assert "nothing to convert" in capsys.readouterr().err


def test_load_ngram_takes_a_trie(tmp_path):
    from dart_core.setup.loading import load_ngram
    data = streams(13)
    path = write(tmp_path, ref_trie(3, data).to_bytes())
    table = load_ngram(str(path), vocab_size=64)
    assert table.vocab_size == 64 and same(table, NGramModel.build(data, 64, 3))
