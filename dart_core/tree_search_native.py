"""DART's tree search in C (machine/tree_search.c), called from dart_core.tree_search where our kernels are built:
the columns it writes, and an n-gram model's tables as it reads them."""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import torch

from .ngram import NGramModel

# Threads a search shares a level's beams among: two measured faster than one inside decoding on a 2-core CPU (the
# n-gram lookups wait on memory two at a time: docs/cpu-speed.md, section 22); more are unmeasured, and a level's 20
# beams leave them little to share
SEARCH_THREADS = 2
# tree_search.c's columns, in its order, as it writes them
COLUMNS = {"token": np.int64, "level": np.int32, "parent": np.int32, "draft_prob": np.float64,
           "logit_term": np.float64, "ngram_prob": np.float64, "ngram_match": np.int8, "ngram_term": np.float64,
           "level_weight": np.float64, "score": np.float64, "beam": np.int8}


def beam_search(kernel, rows_tokens: np.ndarray, rows_probs: np.ndarray, k: int, tail: list[int], cfg,
                eos_ids, ngram: NGramModel | None, budget: int,
                threads: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every candidate's columns (COLUMNS) and the kept ones' indices, in node order, for the search of
    dart_core.tree_search with top-k `k`, the n-gram context `tail` and `budget` nodes (at least one), on `threads`
    threads (None: torch's number, at most SEARCH_THREADS; the same columns whatever the number)."""
    threads = min(torch.get_num_threads(), SEARCH_THREADS) if threads is None else threads
    R = rows_tokens.shape[0]
    tokens = np.ascontiguousarray(rows_tokens, dtype=np.int64)
    probs = np.ascontiguousarray(rows_probs, dtype=np.float64)
    tail = np.asarray(tail, dtype=np.int64)
    weights = _level_weights(cfg, R)
    eos = _eos_array(frozenset(eos_ids))
    size = k * (1 + (R - 1) * cfg.beam_width)
    table = {name: np.empty(size, dtype) for name, dtype in COLUMNS.items()}
    kept, n_kept = np.empty(budget, dtype=np.int64), ctypes.c_long()
    n = kernel.lib.dart_search(
        tokens.ctypes.data, probs.ctypes.data, R, tokens.shape[1], k, tail.ctypes.data, tail.size,
        weights[0].ctypes.data, weights[1].ctypes.data, cfg.ngram_weight, cfg.eps, int(cfg.ngram_first_level),
        cfg.beam_width, budget, eos.ctypes.data, eos.size, _c_table(ngram),
        *(table[name].ctypes.data for name in COLUMNS), kept.ctypes.data, ctypes.byref(n_kept), threads)
    return {name: col[:n] for name, col in table.items()}, kept[: n_kept.value]


def _level_weights(cfg, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Each level's weight and logit weight (SearchConfig.level_weight, logit_weight), made once per knobs: every
    step's search asks for the same ones. (A SearchConfig is not hashable, and this module may not import
    tree_search, which imports it: a dict keyed by the two knobs, not functools.lru_cache.)"""
    key = (cfg.level_exponent, cfg.logit_decay, rows)
    made = _WEIGHTS.get(key)
    if made is None:
        if len(_WEIGHTS) >= 64:   # (the app's sliders could make many)
            _WEIGHTS.clear()
        made = _WEIGHTS[key] = tuple(np.asarray([f(level) for level in range(rows)], dtype=np.float64)
                                     for f in (cfg.level_weight, cfg.logit_weight))
    return made


_WEIGHTS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


@functools.lru_cache(maxsize=16)
def _eos_array(eos_ids: frozenset) -> np.ndarray:
    return np.asarray(sorted(eos_ids), dtype=np.int64)


class _CTable(ctypes.Structure):
    _fields_ = [("order", ctypes.c_int), ("bits", ctypes.c_int), ("keys", ctypes.POINTER(ctypes.c_void_p)),
                ("counts", ctypes.POINTER(ctypes.c_void_p)), ("sizes", ctypes.POINTER(ctypes.c_long)),
                ("starts", ctypes.POINTER(ctypes.c_void_p))]


def _c_table(ngram: NGramModel | None):
    """`ngram`'s tables as tree_search.c reads them (made once per model; None: no n-gram)."""
    if ngram is None:
        return None
    made = ngram.__dict__.get("_c_table")
    if made is None:
        order = ngram.order
        keys = (ctypes.c_void_p * order)(*(k.ctypes.data for k in ngram.keys))
        counts = (ctypes.c_void_p * order)(*(c.ctypes.data for c in ngram.counts))
        sizes = (ctypes.c_long * order)(*(k.size for k in ngram.keys))
        firsts = [_first_token_starts(k, ngram.vocab_size, ngram.bits * i) for i, k in enumerate(ngram.keys)]
        starts = (ctypes.c_void_p * order)(*(f.ctypes.data for f in firsts))
        made = (_CTable(order, ngram.bits, keys, counts, sizes, starts), keys, counts, sizes, starts, firsts)
        ngram.__dict__["_c_table"] = made
    return ctypes.byref(made[0])


def _first_token_starts(keys: np.ndarray, vocab_size: int, shift: int) -> np.ndarray:
    """[vocab + 1]: where the keys whose first token is each token start (the last: the end)."""
    firsts = np.arange(vocab_size, dtype=np.uint64) << np.uint64(shift)
    return np.append(np.searchsorted(keys, firsts), keys.size).astype(np.int64)
