"""The draft token tree: node 0 is the root (the pending token), every other node has an earlier parent.

Parents always come before children (parents[i] < i), so the tree is prefix-closed by construction: every node's
whole path to the root is in the tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


# Trees of up to this many nodes build their ancestor mask a row a node (8 nodes: 3 us, against 14-18 by ancestor
# generations); larger ones, a GPU's shallow wide trees, by generations (a pass per level)
ROW_BY_ROW = 32


@dataclass
class TokenTree:
    tokens: list[int]            # [n] token of each node; tokens[0] is the root
    parents: list[int]           # [n] parent node index; parents[0] == -1
    depths: list[int] = field(init=False)

    def __post_init__(self):
        if not self.tokens or len(self.tokens) != len(self.parents):
            raise ValueError("a tree needs a root and one parent per token")
        if self.parents[0] != -1:
            raise ValueError("node 0 must be the root (parent -1)")
        depths = [0]
        for i, p in enumerate(self.parents[1:], start=1):
            if not 0 <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must come before their children")
            depths.append(depths[p] + 1)
        self.depths = depths

    @classmethod
    def chain(cls, root: int, drafts: list[int]) -> "TokenTree":
        """A single path root -> drafts[0] -> drafts[1] ... (prompt lookup, vanilla decoding)."""
        return cls([root, *drafts], list(range(-1, len(drafts))))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root down to `node`, both included."""
        path = [node]
        while self.parents[path[-1]] != -1:
            path.append(self.parents[path[-1]])
        return path[::-1]

    def leaves(self) -> list[int]:
        has_child = set(self.parents[1:])
        return [i for i in range(len(self)) if i not in has_child]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path (the reference's retrieve_indices, without padding)."""
        return [self.path_to(leaf) for leaf in self.leaves()]

    def follow(self, tokens: list[int]) -> tuple[list[int], int | None]:
        """Walk down from the root along `tokens` (the target's choices): the accepted path and the bonus token
        (None when `tokens` end inside the tree)."""
        children: dict[int, dict[int, int]] = {}
        for n in range(1, len(self)):
            children.setdefault(self.parents[n], {}).setdefault(self.tokens[n], n)
        path = [0]
        for tok in tokens:
            nxt = children.get(path[-1], {}).get(tok)
            if nxt is None:
                return path, tok
            path.append(nxt)
        return path, None

    def with_branch(self, drafts: list[int], max_new: int) -> tuple["TokenTree", list[int]]:
        """This tree plus the path root -> drafts[0] -> drafts[1] ..., sharing the nodes it already has.
        At most `max_new` nodes are added (the path is cut there). Returns the tree and the added node indices."""
        tokens, parents = list(self.tokens), list(self.parents)
        added: list[int] = []
        node = 0
        for tok in drafts:
            child = next((i for i in range(node + 1, len(tokens)) if parents[i] == node and tokens[i] == tok), None)
            if child is None:
                if len(added) >= max_new:
                    break
                tokens.append(int(tok))
                parents.append(node)
                child = len(tokens) - 1
                added.append(child)
            node = child
        return (TokenTree(tokens, parents) if added else self), added

    def ancestor_mask(self, device=None) -> torch.Tensor:
        """[n, n] bool: mask[i, j] is True iff node j is node i or one of its ancestors."""
        n = len(self.parents)
        if n <= ROW_BY_ROW:   # a node's row is its parent's plus itself (parents come first)
            mask = np.zeros((n, n), dtype=bool)
            for i, p in enumerate(self.parents):
                if p >= 0:
                    mask[i, :p + 1] = mask[p, :p + 1]
                mask[i, i] = True
        else:                 # one ancestor generation at a time: depth passes, not a pass a node
            parents = np.asarray(self.parents)
            rows = np.arange(n)
            mask = np.eye(n, dtype=bool)
            up = parents
            while (live := up >= 0).any():
                mask[rows[live], up[live]] = True
                up = np.where(live, parents[np.maximum(up, 0)], -1)
        mask = torch.from_numpy(mask)
        return mask.to(device) if device is not None else mask

    def to_dict(self) -> dict:
        return {"tokens": list(self.tokens), "parents": list(self.parents)}

    @classmethod
    def from_dict(cls, data: dict) -> "TokenTree":
        return cls(list(data["tokens"]), list(data["parents"]))
