"""The DART authors' `.trie` n-gram files (their C++ `trie_ngram`), read into and written from an `NGramModel`.

The file, native little-endian: a header `u64 order, u64 node_count`, then every node in id order (node 0 is the
root): `i32 token, u64 parent, i32 freq, u64 n_children` followed by n_children pairs `(i32 child_token, u64 child_id)`.
A node's freq is the count of the k-gram on its path from the root (the root's: the number of tokens), so each
non-root node becomes one key of `NGramModel` with its freq as the count, and both give the same probabilities.
(Their `reduce(threshold)` lowers the freqs of kept nodes by what it pruned below them, and leaves the root's at
0 minus all it pruned, i.e. negative; the freqs are still what their query divides, so they are read as they are.
The root's freq is never read: their query always walks at least one context token, and it can wrap in int32.)

Their writer numbers the nodes in creation order (first occurrence while counting; `add_all` and `reduce` append
depth-first) and lists each node's children in hash-map order; nothing here assumes more than that node 0 is the
root. Our writer numbers them breadth-first, children in token order, and writes the root's token as 0, as theirs
leaves it.

Every field is a multiple of 4 bytes from the start of the file, so the file is read as 32-bit words, a few MB at a
time; only compact per-node arrays are kept, and the keys are built level by level from the child lists.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from tqdm import tqdm

from ..ngram import NGramError, NGramModel, key_bits

MAX_ORDER = 64            # a packed key holds at most 64 one-bit tokens; anything above is not a trie of ours
NODE_WORDS = 6            # i32 token, u64 parent, i32 freq, u64 n_children
PAIR_WORDS = 3            # i32 child_token, u64 child_id
CHUNK_BYTES = 4 << 20     # read a few MB at a time
WRITE_NODES = 1 << 16     # nodes per written block
CHECK_NODES = 1 << 18     # nodes per block of the child-list checks and of the key building
ROOT_TOKEN = 0            # the root has no token; their writer leaves it 0, ours writes 0; ignored when read


def _excl_cumsum(a: np.ndarray) -> np.ndarray:
    out = np.zeros(a.size, dtype=np.int64)
    np.cumsum(a[:-1], dtype=np.int64, out=out[1:])
    return out


def _ranges(starts: np.ndarray, lengths: np.ndarray, step: int = 1) -> np.ndarray:
    """The concatenation of arange(s, s + step * n, step) for each (s, n), vectorised."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    return (np.repeat(starts.astype(np.int64) - step * _excl_cumsum(lengths), lengths)
            + step * np.arange(total, dtype=np.int64))


def _trie_bytes(n: int) -> int:
    """The size of a trie of n nodes: the header, n records and n - 1 child entries."""
    return 16 + 4 * NODE_WORDS * n + 4 * PAIR_WORDS * (n - 1)


def _u64(words: np.ndarray, at: np.ndarray) -> np.ndarray:
    return words[at].astype(np.uint64) | (words[at + 1].astype(np.uint64) << np.uint64(32))


class _Progress:
    def __init__(self, total: int, desc: str, enabled: bool):
        self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, disable=not enabled,
                        dynamic_ncols=True)

    def __enter__(self):
        return self.bar

    def __exit__(self, *exc):
        self.bar.close()


# ---------------------------------------------------------------------------------------------------- reading
def read_trie(path, vocab_size: int | None = None, progress: bool = False) -> NGramModel:
    """A `.trie` file as an NGramModel. vocab_size: the target's (tokens must lie below it); None: max token + 1."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise NGramError.not_found(path) from None
    except OSError as exc:
        raise NGramError(f"cannot read {path}: {exc.strerror or exc}") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        order, token, freq, n_children, child_ids = _parse(fh, size, path, vocab_size, progress)
    return _to_model(path, order, vocab_size, token, freq, n_children, child_ids)


def _parse(fh, size: int, path, vocab_size: int | None, progress: bool):
    """Read every node record; check each field and that the child lists agree with the children's own records.
    Returns (order, token [N] int32, freq [N] int32, n_children [N] uint32, child_ids [N-1] int64: the child lists
    one after another in node order)."""
    head = fh.read(16)
    if len(head) < 16:
        raise NGramError(f"{path}: too short for a .trie file ({size} bytes; the header alone is 16)")
    order, n = (int(x) for x in np.frombuffer(head, dtype="<u8"))
    if not 2 <= order <= MAX_ORDER:
        raise NGramError(f"{path}: header order {order} is not a usable n-gram order (2..{MAX_ORDER})")
    if vocab_size is not None:
        key_bits(vocab_size, order, f"{path}: ")
    if n < 1:
        raise NGramError(f"{path}: header says 0 nodes (a trie has at least its root)")
    if n > (size - 16) // (4 * NODE_WORDS):
        raise NGramError(f"{path}: header says {n} nodes, but {size} bytes hold at most "
                         f"{(size - 16) // (4 * NODE_WORDS)} (node_count does not match the file size)")
    if size > _trie_bytes(n):   # every node but the root is one child entry, so n fixes the size
        raise NGramError(f"{path}: {size - _trie_bytes(n)} trailing bytes after what {n} nodes take "
                         f"(node_count does not match the file size)")
    token = np.empty(n, dtype=np.int32)
    parent = np.empty(n, dtype=np.uint64)
    freq = np.empty(n, dtype=np.int32)
    n_children = np.empty(n, dtype=np.uint32)      # more than n - 1 children is refused while reading
    child_ids = np.empty(n - 1, dtype=np.int64)
    child_tok = np.empty(n - 1, dtype=np.int32)
    node = pairs = 0                   # nodes and child entries read so far
    buf = b""
    eof = False
    with _Progress(size, "reading trie", progress) as bar:
        bar.update(16)
        while node < n:
            if not eof:
                more = fh.read(max(CHUNK_BYTES, len(buf)))    # doubles the buffer when one record outgrows it
                eof = len(more) == 0
                buf += more
                bar.update(len(more))
            nwords = len(buf) // 4
            words = memoryview(buf)[: nwords * 4].cast("I")   # the file is little-endian, like every host we run on
            offsets, at, bad = _record_starts(words, nwords, n - node, n - 1)
            if bad:   # checked before reading on: an absurd count would otherwise pull in the whole file
                i = node + len(offsets)
                raise NGramError(f"{path}: node {i} claims {words[at + 4] + (words[at + 5] << 32)} children, more "
                                 f"than the {n - 1} non-root nodes")
            if not offsets:
                if eof:
                    raise NGramError(f"{path}: truncated at node {node} of {n} ({size} bytes; {n} nodes take "
                                     f"{_trie_bytes(n)}: a cut file, or a wrong node_count)")
                continue
            w = np.frombuffer(buf, dtype="<u4", count=nwords)
            off = np.asarray(offsets, dtype=np.int64)
            sl = slice(node, node + off.size)
            token[sl] = w[off].view(np.int32)
            parent[sl] = _u64(w, off + 1)
            freq[sl] = w[off + 3].view(np.int32)
            nc = w[off + 4]
            n_children[sl] = nc
            bad = np.flatnonzero(freq[sl] < 0)
            if node == 0:      # the root's freq is never used (and their reduce leaves it negative)
                bad = bad[bad > 0]
            if bad.size:
                i = node + int(bad[0])
                raise NGramError(f"{path}: node {i} has a negative freq ({int(freq[i])})")
            total = int(nc.sum())
            if pairs + total > n - 1:
                raise NGramError(f"{path}: the child lists up to node {node + off.size - 1} name more children than "
                                 f"the {n - 1} non-root nodes")
            at_pairs = _ranges(off + NODE_WORDS, nc, PAIR_WORDS)
            child_tok[pairs: pairs + total] = w[at_pairs].view(np.int32)
            child_ids[pairs: pairs + total] = _u64(w, at_pairs + 1).astype(np.int64)  # >= 2**63 turns negative
            pairs += total
            node += off.size
            del w
            buf = buf[at * 4:]
    # (no bytes are left: the size was checked against n above, and n records with n - 1 entries take all of it)
    if pairs != n - 1:
        raise NGramError(f"{path}: the child lists name {pairs} children, but there are {n - 1} non-root nodes")
    _check_links(path, n, token, parent, n_children, child_ids, child_tok)
    _check_tokens(path, token, vocab_size)
    return order, token, freq, n_children, child_ids


def _check_tokens(path, token, vocab_size: int | None) -> None:
    tokens = token[1:]                 # the root's token means nothing
    bad = np.flatnonzero((tokens < 0) | (tokens >= vocab_size) if vocab_size is not None else tokens < 0)
    if bad.size:
        i = int(bad[0]) + 1
        where = f"outside the vocabulary of {vocab_size}" if vocab_size is not None else "negative"
        raise NGramError(f"{path}: node {i} has token {int(token[i])}, {where}")


def _record_starts(words, nwords: int, limit: int, max_children: int) -> tuple[list[int], int, bool]:
    """Word offsets of the whole records at the start of `words` (at most `limit`), where the next one starts, and
    whether that one claims more than max_children. The one sequential part of reading (each record's place depends
    on the child count of the one before), so it is a tight loop on its own."""
    starts: list[int] = []
    append = starts.append
    at = count = 0
    last = nwords - NODE_WORDS
    while at <= last and count < limit:
        nc = words[at + 4]
        if nc > max_children or words[at + 5]:
            return starts, at, True
        end = at + NODE_WORDS + PAIR_WORDS * nc
        if end > nwords:
            break
        append(at)
        at = end
        count += 1
    return starts, at, False


def _check_links(path, n, token, parent, n_children, child_ids, child_tok) -> None:
    """Every non-root node is in exactly one child list: its parent's, under its own token."""
    bad = np.flatnonzero(parent[1:] >= np.uint64(n))
    if bad.size:
        i = int(bad[0]) + 1
        raise NGramError(f"{path}: node {i} has parent {int(parent[i])}, outside 0..{n - 1}")
    bad = np.flatnonzero((child_ids < 0) | (child_ids >= n))
    if bad.size:
        raise NGramError(f"{path}: a child list names node {int(child_ids[bad[0]]) % 2**64}, outside 0..{n - 1}")
    start = 0
    for a in range(0, n, CHECK_NODES):   # in blocks, so the temporaries stay small
        nc = n_children[a: a + CHECK_NODES]
        end = start + int(nc.sum())
        kids, kid_tok = child_ids[start:end], child_tok[start:end]
        owner = np.repeat(np.arange(a, a + nc.size, dtype=np.uint64), nc)
        bad = np.flatnonzero((parent[kids] != owner) | (kids == 0))
        if bad.size:
            c, p = int(kids[bad[0]]), int(owner[bad[0]])
            raise NGramError(f"{path}: node {p}'s child list names node {c}, whose parent is "
                             f"{int(parent[c]) if c else 'none (the root)'} (inconsistent child list)")
        bad = np.flatnonzero(token[kids] != kid_tok)
        if bad.size:
            c = int(kids[bad[0]])
            raise NGramError(f"{path}: node {int(owner[bad[0]])}'s child list gives node {c} token "
                             f"{int(kid_tok[bad[0]])}, the node itself {int(token[c])} (inconsistent child list)")
        start = end
    listed = np.zeros(n, dtype=bool)
    listed[child_ids] = True
    missing = np.flatnonzero(~listed[1:])
    if missing.size:   # n - 1 entries, all with the right parent: a node left out means another is listed twice
        i = int(missing[0]) + 1
        raise NGramError(f"{path}: node {i} is missing from the child list of its parent {int(parent[i])} "
                         f"(inconsistent child list)")


def _to_model(path, order: int, vocab_size: int | None, token, freq, n_children, child_ids) -> NGramModel:
    """Walk the trie level by level from the root: a level's keys are its parents' keys shifted, plus its tokens."""
    n = token.size
    vocab = int(vocab_size) if vocab_size is not None else (int(token[1:].max()) + 1 if n > 1 else 1)
    bits = key_bits(vocab, order, f"{path}: ")
    child_start = _excl_cumsum(n_children)
    frontier = np.zeros(1, dtype=np.int64)          # this level's nodes, in key order
    frontier_keys = np.zeros(1, dtype=np.uint64)
    keys, counts = [], []
    reached = 1
    for depth in range(1, order + 1):
        nc = n_children[frontier]
        total = int(nc.sum())
        kids, level, count = np.empty(total, np.int64), np.empty(total, np.uint64), np.empty(total, np.int64)
        at = 0
        # The parents are in key order, so all children of one block of them sort below those of the next:
        # sorting block by block sorts the level, with small temporaries.
        for a in range(0, frontier.size, CHECK_NODES):
            block_nc = nc[a: a + CHECK_NODES]
            ids = child_ids[_ranges(child_start[frontier[a: a + CHECK_NODES]], block_nc)]
            k = np.repeat(frontier_keys[a: a + CHECK_NODES], block_nc)
            k <<= np.uint64(bits)
            k |= token[ids].astype(np.uint64)
            sort = np.argsort(k, kind="stable")
            kids[at: at + ids.size], level[at: at + ids.size] = ids[sort], k[sort]
            count[at: at + ids.size] = freq[ids[sort]]
            at += ids.size
        dup = np.flatnonzero(level[1:] == level[:-1])
        if dup.size:
            c = int(kids[dup[0]])
            raise NGramError(f"{path}: a node has two children with token {int(token[c])} (node {c} and another)")
        keys.append(level)
        counts.append(count)
        reached += total
        frontier, frontier_keys = kids, level
    deeper = np.flatnonzero(n_children[frontier])
    if deeper.size:
        c = int(child_ids[child_start[frontier[deeper[0]]]])
        raise NGramError(f"{path}: node {c} is at depth {order + 1}, deeper than the order {order}")
    if reached != n:
        raise NGramError(f"{path}: {n - reached} nodes are not reachable from the root (their parents form a cycle)")
    return NGramModel(order, vocab, keys, counts)


# ---------------------------------------------------------------------------------------------------- writing
def write_trie(model: NGramModel, path, progress: bool = False) -> None:
    """Write `model` as a `.trie` file: node ids in BFS order (root 0, then the 1-grams, 2-grams, ... each level in
    key order, which is the order of their parents and then of their tokens), children listed in token order."""
    bits = np.uint64(model.bits)
    mask = np.uint64((1 << model.bits) - 1)
    sizes = [int(k.size) for k in model.keys]
    first_id = np.cumsum([1] + sizes)            # first_id[k]: the id of the first (k+1)-gram node
    parents = [np.zeros(sizes[0], dtype=np.int64)]   # parents[k][j]: index of key j's prefix among the k-grams
    for k in range(1, model.order):
        prefix = model.keys[k] >> bits
        idx = np.minimum(np.searchsorted(model.keys[k - 1], prefix), max(sizes[k - 1] - 1, 0))
        if sizes[k] and (sizes[k - 1] == 0 or not np.array_equal(model.keys[k - 1][idx], prefix)):
            raise NGramError(f"the table has {k + 1}-grams whose {k}-gram prefix it lacks; cannot make a trie of it")
        parents.append(idx.astype(np.int64))
    for k, c in enumerate(model.counts):
        if c.size and (int(c.max()) > np.iinfo(np.int32).max or int(c.min()) < 0):
            raise NGramError(f"a {k + 1}-gram count does not fit the trie's 32-bit freq")
    # the number of tokens; never read by either query, so a total past 2**31 wraps as their int32 counter would
    root_freq = (int(model.counts[0].sum()) + 2**31) % 2**32 - 2**31
    total_bytes = _trie_bytes(int(first_id[-1]))
    with open(path, "wb") as fh, _Progress(total_bytes, "writing trie", progress) as bar:
        fh.write(np.asarray([model.order, first_id[-1]], dtype="<u8").tobytes())
        bar.update(16)
        # level -1 is the root; level k holds the (k+1)-grams, whose children are the (k+2)-grams
        for level in range(-1, model.order):
            count = 1 if level < 0 else sizes[level]
            kids = parents[level + 1] if level + 1 < model.order else np.zeros(0, dtype=np.int64)
            n_children = np.bincount(kids, minlength=count).astype(np.int64)
            child_start = _excl_cumsum(n_children)
            for a in range(0, count, WRITE_NODES):
                b = min(count, a + WRITE_NODES)
                if level < 0:
                    tok, par, frq = np.asarray([ROOT_TOKEN]), np.zeros(1, np.int64), np.asarray([root_freq])
                else:
                    tok = (model.keys[level][a:b] & mask).astype(np.int64)
                    par = parents[level][a:b] + (first_id[level - 1] if level > 0 else 0)
                    frq = model.counts[level][a:b]
                nc = n_children[a:b]
                j = _ranges(child_start[a:b], nc)      # indices of these nodes' children in the next level
                block = _encode(tok, par, frq, nc, (model.keys[level + 1][j] & mask).astype(np.int64) if j.size
                                else j, j + first_id[level + 1])
                fh.write(block)
                bar.update(len(block))


def _encode(tok, par, frq, nc, child_tok, child_id) -> bytes:
    """Node records, each followed by its child pairs, as little-endian 32-bit words."""
    node_at = NODE_WORDS * np.arange(nc.size, dtype=np.int64) + PAIR_WORDS * _excl_cumsum(nc)
    w = np.zeros(NODE_WORDS * nc.size + PAIR_WORDS * child_id.size, dtype="<u4")
    par = par.astype(np.uint64)
    w[node_at] = tok.astype(np.int32).view(np.uint32)
    w[node_at + 1] = par & np.uint64(0xFFFFFFFF)
    w[node_at + 2] = par >> np.uint64(32)
    w[node_at + 3] = frq.astype(np.int32).view(np.uint32)
    w[node_at + 4] = nc                          # child counts stay below 2**32: the high word is 0
    pair_at = _ranges(node_at + NODE_WORDS, nc, PAIR_WORDS)
    w[pair_at] = child_tok.astype(np.int32).view(np.uint32)
    w[pair_at + 1] = child_id.astype(np.uint64) & np.uint64(0xFFFFFFFF)
    w[pair_at + 2] = child_id.astype(np.uint64) >> np.uint64(32)
    return w.tobytes()
