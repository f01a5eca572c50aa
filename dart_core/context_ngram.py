"""A context-adaptive n-gram: the static table plus the n-grams of the current prompt and output.

Prompt lookup works on code because the text repeats itself; a static table cannot know the user's variable
names. This model adds the current context's own counts (times `weight`) to the static counts and applies the same
backoff to the sum: P(t | s) = (c(s, t) + w c_ctx(s, t)) / (c(s) + w c_ctx(s)) for the longest suffix s of the
context that has seen t in either table. With no static table it is a pure context model.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .errors import ConfigError
from .ngram import NGramModel, backoff


class ContextNGram:
    def __init__(self, static: NGramModel | None, order: int = 3, weight: float = 4.0):
        if static is not None:
            order = static.order
        if order < 2:
            raise ConfigError(f"n-gram order must be at least 2, got {order}")
        if weight <= 0:
            raise ConfigError(f"context weight must be > 0, got {weight}")
        self.static, self.order, self.weight = static, order, weight
        self.vocab_size = static.vocab_size if static is not None else None
        self.reset()

    def reset(self) -> None:
        self.counts: Counter = Counter()  # k-gram tuple (k = 1..order) -> count in the context
        self.seen: list[int] = []

    def observe(self, context: list[int]) -> None:
        """Count the n-grams of `context` not counted yet (between resets the context only grows)."""
        if context[: len(self.seen)] != self.seen:
            self.reset()
        for end in range(len(self.seen) + 1, len(context) + 1):  # every k-gram ending at position end-1
            for k in range(1, min(self.order, end) + 1):
                self.counts[tuple(context[end - k:end])] += 1
        self.seen = list(context)

    def lookup(self, contexts: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Same contract as NGramModel.lookup."""
        return backoff(contexts, tokens, self.order, self._counts)

    def _counts(self, ctx: np.ndarray, tokens: np.ndarray, valid: np.ndarray):
        B, T = tokens.shape
        if self.static is not None:
            num, den = self.static.continuation_counts(ctx, tokens, valid)
        else:
            num, den = np.zeros((B, T)), np.zeros(B)
        for b in np.flatnonzero(valid):
            key = tuple(int(x) for x in ctx[b])
            c_ctx = self.counts.get(key, 0)
            if c_ctx:
                den[b] += self.weight * c_ctx
                num[b] += self.weight * np.fromiter((self.counts.get(key + (int(t),), 0) for t in tokens[b]),
                                                    float, T)
        return num, den
