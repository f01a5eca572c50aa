"""Prompt lookup as decoding goes: the context's n-grams indexed once each, so that a step looks up its latest earlier
occurrence in a few dictionary reads instead of a scan of the whole context, which grows with it (measurements:
docs/cpu-speed.md, section 15).

`LookupIndex.lookup(context)` gives what `PromptLookupProposer.lookup` gives, for contexts that each extend the last
one, as a decode's do (the committed tokens and the root); a context that does not is indexed anew.
"""

from __future__ import annotations


class LookupIndex:
    """For each n of min_ngram..max_ngram, where each n-gram of the context last began (among those that end before
    the context's last token: the context's own last n-gram is not an earlier occurrence of itself)."""

    def __init__(self, min_ngram: int, max_ngram: int, num_tokens: int):
        self.min_ngram, self.max_ngram, self.num_tokens = min_ngram, max_ngram, num_tokens
        self.starts: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}
        self.tokens: list[int] = []   # the context indexed so far

    def lookup(self, context: list[int]) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the context's last n-gram, the longest n first
        (up to num_tokens of them); none where no n-gram occurred before."""
        return self.matched(context)[1]

    def matched(self, context: list[int]) -> tuple[int, list[int]]:
        """`lookup`'s tokens, with the n of the n-gram they follow (0 where none occurred before)."""
        self._extend(context)
        n_ctx = len(context)
        for n in range(min(self.max_ngram, n_ctx - 1), self.min_ngram - 1, -1):
            start = self.starts[n].get(tuple(context[n_ctx - n:]))
            if start is not None:
                return n, [int(t) for t in context[start + n: start + n + self.num_tokens]]
        return 0, []

    def _extend(self, context: list[int]) -> None:
        done = len(self.tokens)
        if done > len(context) or self.tokens[-8:] != list(context[max(done - 8, 0): done]):
            # not an extension of what is indexed (a new prompt without a reset): index it anew
            self.starts, self.tokens, done = {n: {} for n in self.starts}, [], 0
        self.tokens.extend(context[done:])
        tokens = self.tokens
        # the n-grams ending at each position up to the last but one
        for end in range(max(done - 1, 0), len(tokens) - 1):
            for n, starts in self.starts.items():
                start = end - n + 1
                if start >= 0:
                    starts[tuple(tokens[start: end + 1])] = start
