"""Prompt lookup's branch verified alone: no draft head step, no search, the root and the branch's first L tokens.

Where the automatic budget finds that no drafted tree pays (a 2-core CPU, where a drafting step costs a third of a
plain one), `dart_pld` may still verify its lookup branch, at the cost of a dictionary read a step. Which length L
pays is learnt like the drafted trees' budgets: every step's branch, looked up at the longest, is held against what
the target said after it, so the tokens each L would have taken are exact for greedy decoding, and its time is the
cost curve's at 1 + L rows; L = 0 is plain decoding. Only a branch that follows an n-gram of at least ALONE_NGRAM
tokens is taken: a one-token n-gram is a weak clue (docs/cpu-speed.md, section 28).
"""

from __future__ import annotations

import numpy as np

from ..machine.records import CostCurve

# On the 20 prompts of a 2-core AVX2 EPYC, branches of 3 tokens ran 0.98x plain decoding after any n-gram and 1.11x
# after 2 or 3 tokens (docs/cpu-speed.md, section 28).
ALONE_NGRAM = 2


def usable(ngram: int, branch: list[int]) -> list[int]:
    """The branch the lookup found after an n-gram of `ngram` tokens, as the branch alone takes it: whole after an
    n-gram of at least ALONE_NGRAM tokens, else nothing."""
    return branch if ngram >= ALONE_NGRAM else []


class BranchAlone:
    """Per branch length, the tokens the branch alone would have taken and the steps by the nodes it would have
    verified, summed over the settled steps."""

    def __init__(self, lengths):
        """lengths: the branch lengths weighed, ascending (0 among them: plain decoding)."""
        self.lengths = np.asarray(lengths)
        self.longest = int(self.lengths[-1])
        self.pending: list[tuple[int, list[int]]] = []   # (the step's root position, its branch) until settled
        self.steps = 0
        # settled steps by (the tokens their branch got right, its length): one count a step, cheap enough for every
        # step of a plain decode; the sums by length are made when a choice reads them
        self.counts = np.zeros((self.longest + 1, self.longest + 1), dtype=np.int64)

    @property
    def accepted(self) -> np.ndarray:
        """Per length weighed, the tokens its branch would have taken, summed over the settled steps."""
        right = np.arange(self.longest + 1)
        return np.minimum.outer(self.lengths, right) @ self.counts.sum(axis=1)

    @property
    def nodes(self) -> np.ndarray:
        """Per length weighed, the settled steps by the branch nodes it would have verified, [lengths, longest + 1]."""
        by_length = self.counts.sum(axis=0)
        out = np.zeros((len(self.lengths), self.longest + 1), dtype=np.int64)
        for i, n in enumerate(self.lengths):
            np.add.at(out[i], np.minimum(n, np.arange(self.longest + 1)), by_length)
        return out

    def reset(self) -> None:
        """A new prompt: the pending steps' continuation will not come."""
        self.pending = []

    def remember(self, context: list[int], ngram: int, branch: list[int]) -> None:
        """This step's branch at the longest, after an n-gram of `ngram` tokens (nothing after a shorter n-gram than
        ALONE_NGRAM), kept until the target has said as much."""
        self.pending.append((len(context) - 1, usable(ngram, branch)[:self.longest]))

    def settle(self, context: list[int]) -> None:
        """Count every pending step whose continuation `context` now holds."""
        self.pending = [(position, branch) for position, branch in self.pending
                        if not self._add(branch, context[position + 1: position + 1 + len(branch)])]

    def _add(self, branch: list[int], future: list[int]) -> bool:
        if len(future) < len(branch):
            return False
        taken = next((i for i, (a, b) in enumerate(zip(branch, future)) if a != b), len(branch))
        self.counts[taken, len(branch)] += 1
        self.steps += 1
        return True

    def best(self, curve: CostCurve) -> tuple[int, float, float]:
        """The branch alone at its best length on `curve`: (length, expected tokens per step, tokens per second);
        length 0, plain decoding, where no length beats it."""
        plain = 1.0 / curve.time(1)
        if not self.steps:
            return 0, 1.0, plain
        tokens = 1.0 + self.accepted / self.steps
        seconds = self.nodes @ curve.times(1 + np.arange(self.longest + 1)) / self.steps
        i = int(np.argmax(tokens / seconds))   # ties: the shorter branch
        if tokens[i] / seconds[i] <= plain:
            return 0, 1.0, plain
        return int(self.lengths[i]), float(tokens[i]), float(tokens[i] / seconds[i])
