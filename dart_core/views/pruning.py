"""The pruning decisions of one step as a table: per draft row, its best candidates and what happened to them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dart_core.trace import Trace

from .figures import fate_label
from .text_render import token_text

COLUMNS = ("depth", "rank", "after", "token", "draft p", "n-gram p", "matched", "n-gram term", "level w", "score",
           "fate", "beam")


def _visible(text: str) -> str:
    return text.replace("\n", "↵").replace("\t", "⇥")


def pruning_table(trace: Trace, index: int, per_row: int = 8) -> pd.DataFrame:
    """For each draft row (depth), its `per_row` best-scored candidates across the beam.

    `after` is the candidate's parent path (the draft tokens before it); `fate` is kept / beam cut / node budget /
    unseen n-gram. Token text is plain (the table component escapes it), with newlines and tabs made visible.
    """
    empty = pd.DataFrame(columns=list(COLUMNS))
    if not 0 <= index < len(trace.steps):
        return empty
    c = trace.steps[index].candidates
    if c is None or not len(c):
        return empty

    def path_text(i: int) -> str:
        toks = []
        j = int(c.parent[i])
        while j >= 0:
            toks.append(token_text(trace, int(c.token[j])))
            j = int(c.parent[j])
        return _visible("".join(toks[::-1])) or "(root)"

    rows = []
    for level in np.unique(c.level).tolist():
        idx = np.flatnonzero(c.level == level)
        idx = idx[np.argsort(-c.score[idx], kind="stable")][:per_row]
        for rank, i in enumerate(idx.tolist(), start=1):
            match = int(c.ngram_match[i])
            rows.append({
                "depth": int(level) + 1, "rank": rank, "after": path_text(i),
                "token": _visible(token_text(trace, int(c.token[i]))),
                "draft p": round(float(c.draft_prob[i]), 4),
                "n-gram p": "—" if match < 0 else round(float(c.ngram_prob[i]), 4),
                "matched": "—" if match < 0 else ("unseen" if match == 0 else f"{match} tok"),
                "n-gram term": round(float(c.ngram_term[i]), 3), "level w": round(float(c.level_weight[i]), 3),
                "score": round(float(c.score[i]), 3), "fate": fate_label(str(c.fate[i]), str(c.beam[i])),
                "beam": str(c.beam[i])})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def fate_counts(trace: Trace, index: int) -> dict[str, int]:
    """How many candidates of the step ended in each fate label."""
    c = trace.steps[index].candidates if 0 <= index < len(trace.steps) else None
    if c is None:
        return {}
    out: dict[str, int] = {}
    for f, b in zip(c.fate.tolist(), c.beam.tolist()):
        label = fate_label(str(f), str(b))
        out[label] = out.get(label, 0) + 1
    return out
