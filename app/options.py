"""The user-facing knobs: their ranges (shared by the sliders and by validation) and the example prompts. The tree
knobs are the search's own (dart_core.tree_search.search_knobs); only their defaults are the app's."""

from __future__ import annotations

from dart_core.acceptance import SamplingConfig
from dart_core.errors import DartError
from dart_core.setup.defaults import default_search_config
from dart_core.tree_search import Knob, SearchConfig, search_knobs

MAX_PROMPT_CHARS = 6000
MAX_PROMPT_TOKENS = 1024

SAMPLING_KNOBS = (
    Knob("temperature", "Temperature", 0.0, 2.0, 0.0, 0.05, help="0 = greedy"),
    Knob("top_p", "Top-p", 0.05, 1.0, 1.0, 0.05),
    Knob("top_k", "Top-k", 0, 200, 0, 1, integer=True, help="0 = off"),
    Knob("max_new_tokens", "Max new tokens", 1, 512, 64, 1, integer=True),
    Knob("seed", "Seed", 0, 2**31 - 1, 0, 1, integer=True),
)
# The tree knobs: SearchConfig's (its field metadata), at the CPU sweep's winning values.
TREE_KNOBS = search_knobs(default_search_config("cpu"))
TREE_KNOB_NAMES = tuple(k.name for k in TREE_KNOBS)
KNOBS = {k.name: k for k in SAMPLING_KNOBS + TREE_KNOBS}


class OptionError(DartError):
    """A knob or prompt the user gave is out of range; the message says which and why."""


def check_knob(name: str, value) -> float | int:
    knob = KNOBS[name]
    if value is None or value == "":
        raise OptionError(f"{knob.label} is empty")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise OptionError(f"{knob.label} must be a number, got {value!r}") from None
    if number != number or not knob.minimum <= number <= knob.maximum:
        raise OptionError(f"{knob.label} must be between {knob.minimum:g} and {knob.maximum:g}, got {value}")
    if knob.integer:
        if number != int(number):
            raise OptionError(f"{knob.label} must be a whole number, got {value}")
        return int(number)
    return number


def sampling_from(temperature, top_p, top_k, seed) -> SamplingConfig:
    cfg = SamplingConfig(check_knob("temperature", temperature), check_knob("top_p", top_p),
                         check_knob("top_k", top_k), check_knob("seed", seed))
    return cfg.validate()


def search_from(values: dict) -> SearchConfig:
    """The search knobs' values by name (every one of TREE_KNOBS), checked."""
    return SearchConfig(**{name: check_knob(name, values.get(name)) for name in TREE_KNOB_NAMES}).validate()


def check_prompt(text) -> str:
    if not isinstance(text, str) or not text.strip():
        raise OptionError("The prompt is empty: type a prompt or pick an example.")
    if len(text) > MAX_PROMPT_CHARS:
        raise OptionError(f"The prompt is too long: {len(text)} characters, at most {MAX_PROMPT_CHARS}.")
    return text
