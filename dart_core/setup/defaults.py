"""Where the shipped assets and the user cache are, and the defaults measured for them."""

from __future__ import annotations

from pathlib import Path

from ..machine.paths import cache_root  # noqa: F401 (where the set-up's callers have always found it)
from ..tree_search import SearchConfig


def _assets() -> Path:
    """The repository's assets/ in a checkout; dart_core/assets where the package is installed (pyproject.toml)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "assets"
    return installed if installed.is_dir() else package.parent / "assets"


ASSETS = _assets()
DEFAULT_HEAD = ASSETS / "smollm2-dart-head"
DEFAULT_NGRAM = ASSETS / "smollm2-ngram3.npz"
# On a CPU a verify forward grows with the tree, so the reference's 60-node trees lose; 8 nodes won the tree-size
# sweep (measurements: docs/cpu-speed.md#measured-the-fixed-cpu-defaults). Elsewhere: the reference's 60.
CPU_NODE_BUDGET = 8
# dart_pld's prompt-lookup branch: 5 copied tokens raised tau for a few more nodes a step, 10 gained little more
# for twice the nodes (measurements: docs/cpu-speed.md#measured-the-fixed-cpu-defaults).
LOOKUP_TOKENS = 5
# With the automatic node budget the branch's length is chosen with it, up to this many tokens (0: no branch).
LOOKUP_LONGEST = 10
# Prompt lookup as a method of its own (and transformers' prompt lookup in the bench): its defaults.
PLD_TOKENS, PLD_NGRAM = 10, 3
# End-of-turn tokens of common chat templates: generation stops on any of them.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>")


def default_search_config(device: str = "cpu") -> SearchConfig:
    """The reference's knobs, with the node budget measured for CPUs when running on one."""
    return SearchConfig(node_budget=CPU_NODE_BUDGET) if str(device).startswith("cpu") else SearchConfig()


