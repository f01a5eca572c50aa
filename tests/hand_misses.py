"""Hand-built traces whose answers are known by construction: what the missed-token forensics' tests
(test_miss_classes.py) and the candidate pool's (test_pool.py) read.

Every search here runs with level_exponent 0 and logit_decay 1, so a candidate's score is simply the sum of ln p
along its path (plus the n-gram term where a table is given). With the shared rows

    depth 1: 21 (0.6)  22 (0.25)  23 (0.15)        depth 2: 31 (0.5)  32 (0.35)  33 (0.15)

and beam width 2 (23 is never extended), the pool and its ranking (score first) are:

    rank  0: 21       -0.511        rank 5: 22 31  -2.079
    rank  1: 21 31    -1.204        rank 6: 21 33  -2.408
    rank  2: 22       -1.386        rank 7: 22 32  -2.436
    rank  3: 21 32    -1.561        rank 8: 22 33  -3.283
    rank  4: 23       -1.897

so a node budget of b keeps ranks 0..b-1: with b = 3 the tree is {21, 22, 21 31}.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dart_core.acceptance import SamplingConfig
from dart_core.ngram import NGramModel
from dart_core.proposers import PromptLookupProposer
from dart_core.trace import RunSettings, StepRecord, Trace
from dart_core.tree_search import SearchConfig, search

EOS = 2
ROOT = 20                                   # what the prefill emits: the first step's root
PROMPT = [10, 20, 21, 32, 40, 11, 12]       # holds "20 21 32 40": prompt lookup copies it (see the lookup tests)
ROWS = [[21, 22, 23], [31, 32, 33]]
PROBS = [[0.6, 0.25, 0.15], [0.5, 0.35, 0.15]]
CFG = SearchConfig(topk=3, beam_width=2, node_budget=3, level_exponent=0.0, logit_decay=1.0, ngram_weight=0.0)
PROBE = PromptLookupProposer(max_ngram=3, num_tokens=5)



def new_trace(cfg: SearchConfig = CFG, sampling: SamplingConfig | None = None, method: str = "dart") -> Trace:
    """A trace with its prefill (prompt PROMPT, emitting ROOT) and the run's knobs; add steps with `dart_step`."""
    settings = RunSettings(model="hand", sampling=sampling or SamplingConfig(), search=cfg, stop_ids=[EOS])
    return Trace(method, list(PROMPT), [StepRecord(0, "prefill", 0, [ROOT])], settings=settings)


def dart_step(trace: Trace, new: list[int], rows=ROWS, probs=PROBS, ngram: NGramModel | None = None,
              accepted: int | None = None) -> Trace:
    """Append a verify step: the search over `rows` from the trace's context with the trace's knobs (EOS = the stop
    ids), then `new` committed (accepted drafts, then the target's token). `accepted`: by default the greedy
    acceptance (`new` followed down the tree); give it for a sampled step."""
    i = len(trace.steps)
    context = trace.context_at(i)
    rows_t, rows_p = np.asarray(rows, dtype=np.int64), np.asarray(probs, dtype=np.float64)
    result = search(rows_t, rows_p, context, trace.settings.search, ngram, frozenset(trace.settings.stop_ids))
    path, _ = result.tree.follow(new)
    if accepted is None:
        accepted = len(path) - 1
    trace.steps.append(StepRecord(i, "verify", len(context) - 1, list(new), accepted, result.tree, path[:accepted + 1],
                                  rows_t, rows_p, result.candidates))
    return trace


def accepted_at_budget(trace: Trace, i: int, budget: int, ngram: NGramModel | None = None) -> int:
    """Step i's search run again with another node budget, followed along the step's committed tokens."""
    s = trace.steps[i]
    cfg = replace(trace.settings.search, node_budget=budget)   # search() caps its node_budget argument at cfg's
    tree = search(s.rows_tokens, s.rows_probs, trace.context_at(i), cfg, ngram, frozenset(trace.settings.stop_ids))
    return len(tree.tree.follow(s.new_tokens)[0]) - 1


def two_steps() -> Trace:
    """Step 1 accepts 21 and wants 32 (rank 3, cut by the budget of 3); step 2 (root 32) accepts 22 and wants 31
    (rank 5), while the tree holds 31 at depth 2 under 21."""
    return dart_step(dart_step(new_trace(), [21, 32]), [22, 31])
