"""What-if: rerun only the tree search of a recorded DART step with other knobs, and see what would be accepted.

The draft rows of a step depend only on the context, so they are reused as recorded. The accepted path of the new
tree comes from one verification forward when a model is loaded; without a model, a greedy trace still tells it
exactly: greedy decoding is lossless, so the target's choices from this step on are the trace's own output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import DartError
from ..ngram import NGramModel
from ..trace import Trace
from ..tree import TokenTree
from ..tree_search import Candidates, SearchConfig, search
from .replay import replay_step

VERIFIED, REPLAYED, ESTIMATED = "verified", "replayed", "estimated"
HOW_TEXT = {VERIFIED: "verified with one target forward",
            REPLAYED: "from the recorded greedy output (exact: greedy decoding is lossless)",
            ESTIMATED: "estimated from the recorded output (the trace was sampled; a new tree may draw differently)"}

# (context, tree) -> (path, bonus): the loaded model's verification of a tree.
Verifier = Callable[[list[int], TokenTree], tuple[list[int], int]]


class WhatIfError(DartError):
    """A step that what-if cannot rerun."""


@dataclass
class WhatIf:
    index: int
    config: SearchConfig
    tree: TokenTree
    candidates: Candidates
    path: list[int]
    bonus: int | None
    how: str
    context: list[int]
    notes: list[str]
    lookup_nodes: list[int] = field(default_factory=list)   # the recorded prompt-lookup branch, grafted again

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


def is_greedy(trace: Trace) -> bool:
    return trace.settings.sampling.greedy


def what_if(trace: Trace, index: int, config: SearchConfig, ngram: NGramModel | None = None,
            eos_ids=frozenset(), verifier: Verifier | None = None) -> WhatIf:
    if not 0 <= index < len(trace.steps):
        raise WhatIfError(f"there is no step {index} in this trace")
    step = trace.steps[index]
    if step.rows_tokens is None or step.rows_probs is None:
        raise WhatIfError(f"step {index} has no draft rows to search again (only DART's verify steps have them)")
    config.validate()
    notes = []
    recorded_k = step.rows_tokens.shape[1]
    if config.topk > recorded_k:
        notes.append(f"the trace recorded {recorded_k} candidates per row, so top-k above {recorded_k} "
                     f"acts as {recorded_k}")
    replayed = replay_step(trace, index)   # the context, and what the run committed after the step's root
    context = replayed.context
    if ngram is None and config.ngram_weight > 0 and step.candidates is not None \
            and (step.candidates.ngram_match >= 0).any():
        notes.append("the n-gram table used for this trace is not loaded: the search runs without its term")
    result = search(step.rows_tokens, step.rows_probs, context, config, ngram, eos_ids)
    tree, lookup_nodes = result.tree, []
    branch = step.lookup_branch()
    if branch:   # keep the step's prompt-lookup branch: only the search changes
        tree, lookup_nodes = tree.with_branch(branch, len(branch))
    if verifier is not None:
        path, bonus = verifier(context, tree)
        how = VERIFIED
    else:
        path, bonus = tree.follow(replayed.future)
        how = REPLAYED if is_greedy(trace) else ESTIMATED
    return WhatIf(index, config, tree, result.candidates, path, bonus, how, context, notes, lookup_nodes)
