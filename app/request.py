"""A run as the page asks for it: one named value per input of the Run button, in the one order (RUN_FIELDS) that the
page's inputs, its API and the tests all follow. The tree knobs travel as one dict (app.options.TREE_KNOBS, made
from SearchConfig's fields), so no list of them is written here."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .options import KNOBS, TREE_KNOB_NAMES


def _default(name: str):
    return KNOBS[name].default


def default_knobs() -> dict:
    return {name: _default(name) for name in TREE_KNOB_NAMES}


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
    show_pruned: bool = False               # the step view shows the pruned candidates
    lookup_branch: bool = False             # DART's trees also get prompt lookup's continuation as a branch
    auto_budget: bool = False               # DART's node budget chosen as the run goes (node_budget: the start)
    knobs: dict = field(default_factory=default_knobs)   # the tree knobs by name

    @classmethod
    def named(cls, prompt: str = "", **values) -> "RunRequest":
        """A request from values named as the page's inputs: a field's name or a tree knob's."""
        unknown = set(values) - set(RUN_FIELDS)
        if unknown:
            raise TypeError(f"unknown run setting(s): {', '.join(sorted(unknown))}")
        knobs = {name: values.pop(name) for name in TREE_KNOB_NAMES if name in values}
        return cls(prompt, **values, knobs={**default_knobs(), **knobs})

    @classmethod
    def from_values(cls, *values) -> "RunRequest":
        """The request from the page's Run inputs (after the session state), in RUN_FIELDS order."""
        return cls.named(**dict(zip(RUN_FIELDS, values)))

    def values(self) -> tuple:
        """The request as the page's Run inputs (after the session state), in RUN_FIELDS order."""
        return (*(getattr(self, name) for name in _PLAIN_FIELDS), *(self.knobs[name] for name in TREE_KNOB_NAMES))


_PLAIN_FIELDS = tuple(f.name for f in fields(RunRequest) if f.name != "knobs")
RUN_FIELDS = (*_PLAIN_FIELDS, *TREE_KNOB_NAMES)   # the page's component names, in the order of its inputs
