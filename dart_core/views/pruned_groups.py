"""Which pruned candidates the tree figure draws, so that a pool of thousands stays readable.

A step's search records every candidate (about 2,500 at the default knobs) and keeps some 60. The pruned view draws
the best-scored pruned candidates one by one, at most `per_parent` under any drawn parent and `max_shown` in all;
each drawn parent's other pruned children become one "+N more" node, and the pruned candidates that hang under no
drawn parent (or under a parent none of whose pruned children is drawn) become one "+N more" node per depth, so a
depth with nothing drawn collapses to that one node. Every pruned candidate is counted exactly once.

Pure numpy over `Candidates`: no plotly, so tests check the grouping directly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from dart_core.tree_search import Candidates

PER_PARENT = 3      # pruned children drawn under one parent
MAX_SHOWN = 60      # pruned candidates drawn in all (each more is a row of labels)
ROOT = -1           # the parent index of a first-level candidate


@dataclass
class More:
    """Pruned candidates summarised as one node."""
    parent: int | None     # candidate index of the drawn parent (ROOT: the root); None: the rest of a depth
    depth: int             # tree depth of the summarised candidates
    members: list[int]     # their candidate indices, best first

    def best(self, c: Candidates) -> float:
        return float(c.score[self.members[0]])


@dataclass
class PrunedGroups:
    shown: list[int]       # candidate indices drawn one by one, best first (a parent always before its children)
    more: list[More]       # per-parent summaries, then per-depth ones, each group by depth
    total: int             # pruned candidates in the step


def pruned_groups(c: Candidates, per_parent: int = PER_PARENT, max_shown: int = MAX_SHOWN) -> PrunedGroups:
    pruned = np.flatnonzero(c.node < 0)
    # Best first; a child never outscores its parent and ties go shallower first, so a parent is decided first.
    order = pruned[np.lexsort((pruned, c.level[pruned], -c.score[pruned]))].tolist()
    drawn = {ROOT, *np.flatnonzero(c.node > 0).tolist()}
    under: Counter[int] = Counter()     # pruned children drawn per parent
    shown, rest = [], []
    for i in order:
        p = int(c.parent[i])
        if p in drawn and under[p] < per_parent and len(shown) < max_shown:
            shown.append(i)
            drawn.add(i)
            under[p] += 1
        else:
            rest.append(i)
    groups: dict[tuple[int, int | None], More] = {}
    for i in rest:   # still best first, so each group's members are too
        p = int(c.parent[i])
        parent = p if under[p] else None
        depth = int(c.level[i]) + 1
        groups.setdefault((depth, parent), More(parent, depth, [])).members.append(i)
    more = sorted(groups.values(), key=lambda m: (m.parent is None, m.depth))
    return PrunedGroups(shown, more, len(pruned))
