"""A run as the page asks for it: one named field per input of the Run button, in the one order (RUN_FIELDS) that the
page's inputs, its API (`/run`, which scripts/soak.py calls through gradio_client) and the tests all follow."""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

from .options import KNOBS


def _default(name: str):
    return KNOBS[name].default


@dataclass
class RunRequest:
    """The values are as the page sends them (checked by app.options when the run starts)."""
    prompt: str = ""
    use_pld: bool = False                   # a third lane: prompt lookup
    temperature: float = _default("temperature")
    top_p: float = _default("top_p")
    top_k: int = _default("top_k")
    max_new_tokens: int = _default("max_new_tokens")
    seed: int = _default("seed")
    node_budget: int = _default("node_budget")
    beam_width: int = _default("beam_width")
    topk: int = _default("topk")
    ngram_weight: float = _default("ngram_weight")
    level_exponent: float = _default("level_exponent")
    logit_decay: float = _default("logit_decay")
    show_pruned: bool = False               # the step view shows the pruned candidates
    lookup_branch: bool = False             # DART's trees also get prompt lookup's continuation as a branch
    auto_budget: bool = False               # DART's node budget chosen as the run goes (node_budget: the start)

    def values(self) -> tuple:
        """The request as the page's Run inputs (after the session state), in RUN_FIELDS order."""
        return astuple(self)


RUN_FIELDS = tuple(f.name for f in fields(RunRequest))   # the page's component names, in the order of its inputs
