"""An order-n token n-gram model with the reference's backoff, stored as sorted packed keys in numpy.

Each k-gram (k = 1..order) is packed into one uint64, first token in the high bits, so the keys of each order sort
by prefix. A query is a binary search, vectorized over a batch of (context, candidate token) pairs: in our C kernel
where it is built (machine/tree_search.c: the candidates of one context searched inside that context's run of keys),
else numpy's `searchsorted`; both give the same counts.

Backoff, as in the DART reference: for the longest context suffix first, a candidate seen after that suffix gets
P = count(suffix + token) / count(suffix); candidates not seen after any suffix get probability 0 ("unseen").
There is no discount and no unigram level, so probabilities from different lengths are not renormalized.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .errors import DartError
from .machine.hardware import kernels_here

UNSEEN = 0  # matched context length reported for a token never seen after any suffix of its context


class NGramError(DartError):
    """An n-gram table that cannot be built or read."""

    @classmethod
    def not_found(cls, path) -> "NGramError":
        return cls(f"n-gram file not found: {path}")


def key_bits(vocab_size: int, order: int, where: str = "") -> int:
    """The bits a token takes in a packed key; an error (prefixed by `where`) if `order` of them do not fit in 64."""
    bits = max(1, int(vocab_size - 1).bit_length())
    if bits * order > 64:
        raise NGramError(f"{where}order {order} with a vocabulary of {vocab_size} does not fit in 64-bit keys")
    return bits


class NGramModel:
    def __init__(self, order: int, vocab_size: int, keys: list[np.ndarray], counts: list[np.ndarray]):
        if order < 2:
            raise NGramError(f"n-gram order must be at least 2, got {order}")
        self.order = order
        self.vocab_size = vocab_size
        self.bits = key_bits(vocab_size, order)
        if len(keys) != order or len(counts) != order:
            raise NGramError("need one key array and one count array per order")
        self.keys = [np.asarray(k, dtype=np.uint64) for k in keys]      # keys[k-1]: sorted packed k-grams
        self.counts = [np.asarray(c, dtype=np.int64) for c in counts]   # counts[k-1][i]: count of keys[k-1][i]

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, streams: Iterable[Sequence[int]], vocab_size: int, order: int = 3) -> "NGramModel":
        """Count every k-gram (k <= order) inside each token stream; n-grams never cross stream boundaries."""
        bits = key_bits(vocab_size, order)
        chunks: list[list[np.ndarray]] = [[] for _ in range(order)]
        for stream in streams:
            ids = np.asarray(stream, dtype=np.uint64)
            if ids.size and int(ids.max()) >= vocab_size:
                raise NGramError(f"token id {int(ids.max())} is outside the vocabulary of {vocab_size}")
            packed = np.zeros(ids.size, dtype=np.uint64)
            for k in range(1, order + 1):
                if ids.size < k:
                    break
                # packed[i] holds ids[i..i+k-1]: shift the (k-1)-grams left and add the next token.
                packed = (packed[: ids.size - k + 1] << np.uint64(bits)) | ids[k - 1:]
                chunks[k - 1].append(packed.copy())
        keys, counts = [], []
        for k in range(order):
            allk = np.concatenate(chunks[k]) if chunks[k] else np.zeros(0, dtype=np.uint64)
            uniq, cnt = np.unique(allk, return_counts=True)
            keys.append(uniq)
            counts.append(cnt.astype(np.int64))
        return cls(order, vocab_size, keys, counts)

    # ------------------------------------------------------------------ queries
    def _count(self, k: int, packed: np.ndarray) -> np.ndarray:
        """Counts of packed k-grams (0 where absent)."""
        table, cnt = self.keys[k - 1], self.counts[k - 1]
        if table.size == 0:
            return np.zeros(packed.shape, dtype=np.int64)
        pos = np.searchsorted(table, packed)
        pos_c = np.minimum(pos, table.size - 1)
        return np.where(table[pos_c] == packed, cnt[pos_c], 0)

    def continuation_counts(self, ctx: np.ndarray, tokens: np.ndarray, valid: np.ndarray):
        """ctx [B, m] context suffixes (rows where `valid` is False are ignored), tokens [B, T] ids of the vocabulary.
        Returns (count(ctx + token) [B, T], count(ctx) [B]) as float64."""
        bits = np.uint64(self.bits)
        ctx_key = np.zeros(len(ctx), dtype=np.uint64)
        for j in range(ctx.shape[1]):
            ctx_key = (ctx_key << bits) | np.where(valid, ctx[:, j], 0).astype(np.uint64)
        kernel = kernels_here()   # our C lookups where they are built (None: numpy's)
        if kernel is not None:
            return self._native_counts(kernel, ctx.shape[1], ctx_key, valid, tokens)
        den = np.where(valid, self._count(ctx.shape[1], ctx_key), 0).astype(np.float64)
        num = self._count(ctx.shape[1] + 1, (ctx_key[:, None] << bits) | tokens.astype(np.uint64))
        return (num * valid[:, None]).astype(np.float64), den

    def lookup(self, contexts: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Backoff probabilities of candidate tokens after contexts.

        contexts: [B, c] int, the last c tokens of each context (c may be < order-1; -1 marks missing tokens
                  on the left, for contexts shorter than c).
        tokens:   [B, T] int candidate tokens.
        Returns (probs [B, T] float64, matched [B, T] int8: the context length whose counts gave the
        probability, or UNSEEN (0)).
        """
        return backoff(contexts, tokens, self.order, self.continuation_counts)

    def prob(self, context: Sequence[int], tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Single-context convenience form of `lookup`."""
        ctx = list(context)[-(self.order - 1):]
        ctx = [-1] * (self.order - 1 - len(ctx)) + ctx
        p, m = self.lookup(np.asarray([ctx]), np.asarray([list(tokens)]))
        return p[0], m[0]

    def _native_counts(self, kernel, m: int, ctx_key: np.ndarray, valid: np.ndarray, tokens: np.ndarray):
        B, T = tokens.shape
        ctx_key = np.ascontiguousarray(ctx_key, dtype=np.uint64)
        valid = np.ascontiguousarray(valid, dtype=np.uint8)
        tokens = np.ascontiguousarray(tokens, dtype=np.int64)
        num, den = np.empty((B, T)), np.empty(B)
        keys_m, keys_next = self.keys[m - 1], self.keys[m]
        kernel.lib.ngram_counts(
            ctx_key.ctypes.data, valid.ctypes.data, tokens.ctypes.data, B, T, self.bits,
            keys_m.ctypes.data, self.counts[m - 1].ctypes.data, keys_m.size,
            keys_next.ctypes.data, self.counts[m].ctypes.data, keys_next.size, num.ctypes.data, den.ctypes.data)
        return num, den

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> None:
        arrays = {"meta": np.asarray([self.order, self.vocab_size], dtype=np.int64)}
        for k in range(self.order):
            arrays[f"keys{k + 1}"] = self.keys[k]
            arrays[f"counts{k + 1}"] = self.counts[k]
        with open(path, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    @classmethod
    def load(cls, path) -> "NGramModel":
        try:
            with np.load(path) as data:
                order, vocab = (int(x) for x in data["meta"])
                keys = [data[f"keys{k + 1}"] for k in range(order)]
                counts = [data[f"counts{k + 1}"] for k in range(order)]
        except FileNotFoundError:
            raise NGramError.not_found(path) from None
        except Exception as exc:  # zip / pickle / key errors all mean the same thing to the user
            raise NGramError(f"{path} is not a valid n-gram file ({type(exc).__name__}: {exc})") from None
        for k in range(order):
            if keys[k].shape != counts[k].shape:
                raise NGramError(f"{path}: keys{k + 1} and counts{k + 1} differ in length")
        return cls(order, vocab, keys, counts)


def backoff(contexts, tokens, order: int, counts_fn) -> tuple[np.ndarray, np.ndarray]:
    """The reference's backoff over any count source: for the longest context suffix first, a token seen after it
    gets count(suffix + token) / count(suffix); a token seen after no suffix gets 0 (UNSEEN).
    counts_fn(ctx [B, m], tokens [B, T], valid [B]) -> (num [B, T], den [B])."""
    contexts = np.asarray(contexts, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    probs = np.zeros(tokens.shape, dtype=np.float64)
    matched = np.zeros(tokens.shape, dtype=np.int8)
    for length in range(min(order - 1, contexts.shape[1]), 0, -1):
        ctx = contexts[:, contexts.shape[1] - length:]
        valid = (ctx >= 0).all(axis=1)
        num, den = counts_fn(ctx, tokens, valid)
        hit = (matched == UNSEEN) & (num > 0) & (den[:, None] > 0)
        probs = np.where(hit, num / np.maximum(den[:, None], 1e-12), probs)
        matched = np.where(hit, np.int8(length), matched)
    return probs, matched
