import random
from collections import Counter

import numpy as np
import pytest

from dart_core import ngram
from dart_core.machine.hardware import kernels_here
from dart_core.ngram import UNSEEN, NGramError, NGramModel


def naive_counts(streams, order):
    c = Counter()
    for s in streams:
        for k in range(1, order + 1):
            for i in range(len(s) - k + 1):
                c[tuple(s[i:i + k])] += 1
    return c


def naive_prob(counts, order, context, token):
    """The reference's backoff: longest matching suffix that has seen the token wins; else unseen."""
    for length in range(min(order - 1, len(context)), 0, -1):
        ctx = tuple(context[-length:])
        if counts.get(ctx, 0) and counts.get(ctx + (token,), 0):
            return counts[ctx + (token,)] / counts[ctx], length
    return 0.0, UNSEEN


def test_backoff_cases():
    m = NGramModel.build([[1, 2, 3, 1, 2, 4, 5, 2, 6]], vocab_size=10, order=3)
    p, match = m.prob([1, 2], [3, 4, 6, 7])
    # after (1, 2): 3 once, 4 once of 2 -> 0.5 each; 6 only after (5, 2) -> bigram 2->6: 1 of 3; 7 never
    assert p.tolist() == pytest.approx([0.5, 0.5, 1 / 3, 0.0])
    assert match.tolist() == [2, 2, 1, UNSEEN]
    # a context never seen at trigram level backs off to the bigram of its last token
    p, match = m.prob([9, 2], [3, 6])
    assert p.tolist() == pytest.approx([1 / 3, 1 / 3]) and match.tolist() == [1, 1]
    # a one-token context works (order 3 needs 2; the missing one is padded)
    p, match = m.prob([5], [2, 3])
    assert p.tolist() == pytest.approx([1.0, 0.0]) and match.tolist() == [1, UNSEEN]


def test_streams_do_not_join():
    m = NGramModel.build([[1, 2], [3, 4]], vocab_size=8, order=2)
    p, match = m.prob([2], [3])
    assert p[0] == 0 and match[0] == UNSEEN


def test_counts_and_lookup_match_naive_model():
    rng = random.Random(0)
    streams = [[rng.randrange(12) for _ in range(rng.randrange(1, 60))] for _ in range(30)]
    for order in (2, 3, 4):
        m = NGramModel.build(streams, vocab_size=12, order=order)
        counts = naive_counts(streams, order)
        assert int(m.counts[0].sum()) == sum(len(s) for s in streams)
        for _ in range(200):
            ctx = [rng.randrange(12) for _ in range(rng.randrange(1, order + 1))]
            toks = [rng.randrange(12) for _ in range(5)]
            p, match = m.prob(ctx, toks)
            for t, pi, mi in zip(toks, p, match):
                ep, em = naive_prob(counts, order, ctx, t)
                assert pi == pytest.approx(ep) and mi == em


def test_the_c_counts_are_numpys(monkeypatch):
    """Where our kernels are built the counts come from C (each context's run of keys searched once): exactly what
    numpy's searchsorted gives, up to keys filling all 64 bits and tokens at the top of the vocabulary."""
    rng = np.random.default_rng(5)
    for vocab, order in ((16, 3), (16, 16), (50, 4), (2, 2)):
        streams = [rng.integers(0, vocab, rng.integers(1, 200)).tolist() for _ in range(20)]
        streams.append([vocab - 1] * 40)                         # the largest keys of every order
        m = NGramModel.build(streams, vocab_size=vocab, order=order)
        if kernels_here() is None:      # no C compiler here: numpy's counts are all there is
            return
        contexts = rng.integers(-1, vocab, (40, order - 1))
        contexts[:5] = vocab - 1
        tokens = rng.integers(0, vocab, (40, 7))
        tokens[:, 0] = vocab - 1
        native = m.lookup(contexts, tokens)
        with monkeypatch.context() as numpy_only:
            numpy_only.setattr(ngram, "kernels_here", lambda: None)
            assert all(np.array_equal(a, b) for a, b in zip(native, m.lookup(contexts, tokens))), (vocab, order)
        assert native[1].max() == order - 1                      # some contexts matched at full length


def test_batched_lookup_equals_single():
    rng = random.Random(3)
    streams = [[rng.randrange(20) for _ in range(100)] for _ in range(5)]
    m = NGramModel.build(streams, vocab_size=20, order=3)
    ctx = np.asarray([[rng.randrange(20) for _ in range(2)] for _ in range(7)])
    toks = np.asarray([[rng.randrange(20) for _ in range(9)] for _ in range(7)])
    p, match = m.lookup(ctx, toks)
    for b in range(7):
        pb, mb = m.prob(ctx[b].tolist(), toks[b].tolist())
        assert np.array_equal(p[b], pb) and np.array_equal(match[b], mb)


def test_save_load_round_trip(tmp_path):
    a = NGramModel.build([[1, 2, 3, 2, 3]], vocab_size=50, order=3)
    path = tmp_path / "ng.npz"
    a.save(path)
    loaded = NGramModel.load(path)
    assert loaded.order == 3 and loaded.vocab_size == 50
    for k in range(3):
        assert np.array_equal(loaded.keys[k], a.keys[k]) and np.array_equal(loaded.counts[k], a.counts[k])


def test_bad_input(tmp_path):
    with pytest.raises(NGramError, match="outside the vocabulary"):
        NGramModel.build([[1, 99]], vocab_size=10)
    with pytest.raises(NGramError, match="64-bit"):
        NGramModel.build([[1]], vocab_size=200_000, order=4)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(NGramError, match="not a valid n-gram file"):
        NGramModel.load(bad)
    with pytest.raises(NGramError, match="not found"):
        NGramModel.load(tmp_path / "missing.npz")


def test_context_ngram_adds_the_contexts_own_counts():
    from dart_core.context_ngram import ContextNGram

    static = NGramModel.build([[1, 2, 3, 1, 2, 4]], vocab_size=20, order=3)
    ctx_model = ContextNGram(static, weight=2.0)
    ctx_model.observe([7, 1, 2, 9, 5])
    # after (1, 2): static 3 once, 4 once; context 9 once (x2): (1, 1, 2) / (2 + 2)
    p, match = ctx_model.lookup(np.asarray([[1, 2]]), np.asarray([[3, 4, 9, 11]]))
    assert p[0].tolist() == pytest.approx([0.25, 0.25, 0.5, 0.0]) and match[0].tolist() == [2, 2, 2, 0]
    # a context-only continuation is found where the static table knows nothing
    p, match = ctx_model.lookup(np.asarray([[9, 5]]), np.asarray([[1]]))
    assert match[0, 0] == UNSEEN
    ctx_model.observe([7, 1, 2, 9, 5, 1])   # grows incrementally
    p, match = ctx_model.lookup(np.asarray([[9, 5]]), np.asarray([[1]]))
    assert p[0, 0] == 1.0 and match[0, 0] == 2
    ctx_model.observe([8, 8])                # a new prompt: counts start over
    p, _ = ctx_model.lookup(np.asarray([[9, 5]]), np.asarray([[1]]))
    assert p[0, 0] == 0.0
    # without a static table it is a pure context model, and equals a table built from the context alone
    pure = ContextNGram(None, order=3, weight=1.0)
    stream = [3, 4, 5, 3, 4, 6, 3, 4, 5]
    pure.observe(stream)
    ref = NGramModel.build([stream], vocab_size=10, order=3)
    ctx = np.asarray([[3, 4], [9, 4], [0, 5]])
    toks = np.asarray([[5, 6, 3], [5, 6, 3], [3, 4, 5]])
    for a, b in zip(pure.lookup(ctx, toks), ref.lookup(ctx, toks)):
        assert np.allclose(a, b)
