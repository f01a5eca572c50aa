"""What a DART step would have accepted with another tree, once the target's continuation after it is known.

The beam search's candidate pool does not depend on the node budget: the tree of budget b is the pool's top b by the
search's own ranking, and a candidate always ranks after its parent. So once the target has said what follows a
step's root (the tokens the following steps commit; exact for greedy runs, the sampled tokens otherwise), the draft
tokens the step would have accepted under every budget b, and the tree's nodes, can be read off its pool: as many
tokens of the target's path as have a pool rank below b. A prompt-lookup branch grafted on the tree adds its nodes
and accepts at least its agreement with the target; it depends on the context alone, so a branch of every length
(its first L tokens) is read off one lookup of the longest.

One place for it, read by the automatic budget (dart_core.budget.auto, as the run goes), the forensics (from a trace,
with its steps as dart_core.forensics.replay gives them; a step's own branch is `StepRecord.lookup_branch`) and
studies/tune_search.py:
- `CandidatePool`: a step's candidates as the replays read them, with `accepted` / `accepted_by_length`;
- `expected_rate`: tokens per second from tokens per step, tree nodes, drafting time and the cost curve t(k).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..machine.hardware import kernels_here
from ..machine.records import CostCurve
from ..tree_search import Candidates, SearchResult


def expected_rate(tokens, nodes, overhead: float, curve: CostCurve):
    """Expected tokens per second: `tokens` per verify step (the bonus token included) over the step's time, the
    drafting and search `overhead` plus a verify of the root and `nodes` tree nodes, t(1 + nodes). Scalars or arrays
    alike."""
    return tokens / (overhead + curve.times(1 + nodes))


def pool_ranks(c: Candidates) -> np.ndarray:
    """The search's own ranking of its pool (score first, shallower on ties), as a rank per candidate."""
    order = np.lexsort((c.level, -c.score))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def pool_path(token: np.ndarray, parent: np.ndarray, path: list[int]) -> list[int]:
    """The pool's candidates spelling `path` from the root, as far as the pool holds it (a parent's children carry
    distinct tokens, so the walk is unique)."""
    out, prev = [], -1
    for t in path:
        hit = np.flatnonzero((parent == prev) & (token == t))
        if not hit.size:
            break
        prev = int(hit[0])
        out.append(prev)
    return out


@dataclass
class CandidatePool:
    """A step's candidate pool as the replays read it: each candidate's token and parent, and the search's ranking
    keys (its score, and its level for ties)."""
    token: np.ndarray
    parent: np.ndarray
    score: np.ndarray
    level: np.ndarray

    @classmethod
    def of(cls, c: "Candidates | CandidatePool") -> "CandidatePool":
        return cls(c.token, c.parent, c.score, c.level)

    @classmethod
    def of_search(cls, result: SearchResult) -> "CandidatePool":
        """A search's pool from the columns it ranked, whether or not it recorded its candidates."""
        c = result.columns
        return cls(c["token"], c["parent"], c["score"], c["level"])

    def ranks_of(self, idx: np.ndarray) -> np.ndarray:
        """pool_ranks of the candidates `idx` alone: how many candidates the search ranks before each (a higher
        score, or an equal one shallower, or equal in both and earlier in the pool). A replay asks a handful of
        them per step; ranking the whole pool of thousands cost the automatic budget 0.15 ms a step."""
        idx = np.asarray(idx, dtype=np.int64)[:, None]
        s, lv = self.score[idx], self.level[idx]
        ties = self.score == s
        before = (self.score > s) | (ties & (self.level < lv)) | (ties & (self.level == lv) &
                                                                   (np.arange(len(self.score)) < idx))
        return before.sum(axis=1)

    def path_ranks(self, path: list[int]) -> np.ndarray:
        """The ranks of the candidates spelling `path` from the root, as far as the pool holds it: in one pass of our
        C code where it is built (machine/tree_search.c: pool_path_ranks), the same numbers."""
        kernel = kernels_here()
        if kernel is None:
            return self.ranks_of(pool_path(self.token, self.parent, path))
        columns = [np.ascontiguousarray(c, dtype=t) for c, t in ((self.token, np.int64), (self.parent, np.int32),
                                                                 (self.score, np.float64), (self.level, np.int32))]
        path = np.ascontiguousarray(path, dtype=np.int64)
        ranks = np.empty(len(path), dtype=np.int64)
        found = kernel.lib.pool_path_ranks(*(c.ctypes.data for c in columns), len(columns[0]), path.ctypes.data,
                                           len(path), ranks.ctypes.data)
        return ranks[:found]

    def accepted(self, branch: list[int], target_path: list[int], budgets) -> tuple[np.ndarray, np.ndarray]:
        """The draft tokens the target would have accepted, and the tree's nodes, under each budget (the tree is the
        pool's top b, plus the lookup branch `branch` where there is one)."""
        accepted, nodes = self.accepted_by_length(branch, target_path, budgets, [len(branch)])
        return accepted[0], nodes[0]

    def accepted_by_length(self, branch: list[int], target_path: list[int], budgets,
                           lengths) -> tuple[np.ndarray, np.ndarray]:
        """`accepted` for the branch's first L tokens, for each L of `lengths`: arrays [len(lengths), budgets]."""
        b = np.asarray(budgets)[None, :]
        # a tree of the top b holds as many of the path's candidates as rank below b
        pool_accepted = np.searchsorted(np.sort(self.path_ranks(target_path)), b[0])
        pool_nodes = np.minimum(b[0], len(self.token)).astype(np.float64)
        if not branch:   # no lookup branch (dart): the pool's alone, whatever the lengths
            return np.tile(pool_accepted.astype(np.float64), (len(lengths), 1)), np.tile(pool_nodes, (len(lengths), 1))
        agree = next((i for i, (x, y) in enumerate(zip(branch, target_path)) if x != y),
                     min(len(branch), len(target_path)))
        # the branch's nodes the pool's top b already holds, for each prefix length of the branch
        in_pool = np.zeros((len(branch) + 1, b.shape[1]))
        in_pool[1:] = np.cumsum(_padded(self.path_ranks(branch), len(branch))[:, None] < b, axis=0)
        accepted = np.empty((len(lengths), b.shape[1]))
        nodes = np.empty((len(lengths), b.shape[1]))
        for i, n in enumerate(lengths):
            n = min(int(n), len(branch))
            accepted[i] = np.maximum(pool_accepted, min(n, agree))
            nodes[i] = pool_nodes + n - in_pool[n]
        return accepted, nodes


def _padded(ranks: np.ndarray, n: int) -> np.ndarray:
    """CandidatePool ranks of a branch's first tokens, padded to n with 'not in the pool' (the pool left the branch there)."""
    out = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    out[:len(ranks)] = ranks
    return out
