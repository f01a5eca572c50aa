"""What several commands share: the argument parser that exits with one line, the model and search arguments, and
the error a bad argument raises."""

from __future__ import annotations

import argparse

from ..errors import DartError
from ..machine.records import AUTO_KERNELS, DRAFT_KERNEL_MODES
from ..methods import METHODS
from ..setup.defaults import default_search_config
from ..setup.hub import HUB_ENV, PRESETS, allow_hub, expand_preset
from ..tree_search import SearchConfig, search_knobs

DTYPE_CHOICES = ["auto", "fast", "fp32", "bf16", "fp16", "float32", "bfloat16", "float16"]
DRAFT_KERNELS_HELP = ("how DART's head drafts: 'native' (our C layer, bf16 weights), 'native-int8' (our C layer, int8 "
                      "weights), 'int8' (torch, an int8 copy of the head), 'fp32' (torch, the head as it is), or "
                      "'auto' (the default): the fastest of those measured on this CPU (int8 weights only by a "
                      "margin); the emitted tokens never depend on it (the target verifies every draft)")
DTYPE_HELP = ("'auto' (the default): fp32, the dtype in which DART is token-identical to plain decoding; 'fast': the "
              "dtype measured fastest here (bf16 only where it beats fp32; not token-identical); or fp32, bf16, fp16 "
              "(the choice and why are in --json)")
BATCH_DTYPE_HELP = ("'fast' (the default): bf16 where it measures faster than fp32 at the rows of batched work (32 and "
                    "256 rows: a CPU without native bf16 is far slower in it), else fp32; or auto (fp32), fp32, bf16, "
                    "fp16")


class CliError(DartError):
    """A bad command-line argument."""


class Parser(argparse.ArgumentParser):
    """Bad arguments end with one line on stderr and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


MODEL_HELP = ("'default' (SmolLM2-135M-Instruct, embedded), a transformers folder, a hub id, or a preset of the DART "
              f"authors' released heads ({', '.join(PRESETS)}: target, head and n-gram table together)")
DRAFT_HELP = "'default' (the shipped head), 'random', a head folder (ours or the DART authors'), or a hub id"
NGRAM_HELP = "'default', 'none', an n-gram .npz or .trie file, or a hub file as repo:file"
HUB_HELP = (f"let hub ids be downloaded (through huggingface_hub); without it (or {HUB_ENV}=1) only the local hub "
            "cache is read and nothing is ever downloaded")


def add_model_args(p: argparse.ArgumentParser, dtype_default: str = "auto", dtype_help: str = DTYPE_HELP) -> None:
    p.add_argument("--model", default="default", help=MODEL_HELP)
    p.add_argument("--draft", default="default", help=DRAFT_HELP)
    p.add_argument("--ngram", default="default", help=NGRAM_HELP)
    p.add_argument("--hub", action="store_true", help=HUB_HELP)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=dtype_default, choices=DTYPE_CHOICES, help=dtype_help)
    p.add_argument("--draft-kernels", default=AUTO_KERNELS, choices=DRAFT_KERNEL_MODES, help=DRAFT_KERNELS_HELP)
    p.add_argument("--recalibrate", action="store_true",
                   help="measure this machine's kernels and verify cost curve again (they are cached per machine)")


THINKING_HELP = ("let the chat template open a reasoning block (Qwen3's enable_thinking); off by default, as in the "
                 "DART authors' evaluation")


def resolve_model_names(args) -> None:
    """A preset named by --model fills in --draft and --ngram left at 'default'; --hub is the download opt-in."""
    if getattr(args, "model", None) is not None:
        args.model, draft, ngram = expand_preset(args.model, getattr(args, "draft", None), getattr(args, "ngram", None))
        for name, value in (("draft", draft), ("ngram", ngram)):
            if hasattr(args, name):   # commands that read only a tokenizer have neither
                setattr(args, name, value)
    if getattr(args, "hub", False):
        allow_hub()


def add_method_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="dart", choices=list(METHODS),
                   help="dart_pld: DART's tree plus prompt lookup's continuation as one more branch")


NODE_BUDGET_HELP = ("or 'auto' (the default): chosen as the run goes for the most tokens per second on this machine's "
                    "measured verify cost, starting from 8 on CPU (60 elsewhere)")


def add_search_args(p: argparse.ArgumentParser) -> None:
    """An option per search knob (tree_search.search_knobs), then the n-gram context weight and the lookup branch."""
    g = p.add_argument_group("tree search knobs")
    for knob in search_knobs():
        if knob.name == "node_budget":   # a number or 'auto'
            g.add_argument(knob.flag, default="auto", help=f"{knob.help}, {NODE_BUDGET_HELP}")
        else:
            g.add_argument(knob.flag, type=int if knob.integer else float, default=knob.default, help=knob.help)
    g.add_argument("--ngram-context-weight", type=float, default=0.0,
                   help="also count the prompt's and output's own n-grams, with this weight (0 = static table only)")
    g.add_argument("--lookup-tokens", type=int, default=None,
                   help="dart_pld: tokens in the prompt-lookup branch added to DART's tree (default: with --node-budget "
                        "auto, chosen with the budget as the run goes, 0-10; with a fixed budget, 5)")


def _dest(knob) -> str:
    """Where argparse keeps a knob's option (--topk-per-row: args.topk_per_row)."""
    return knob.flag.removeprefix("--").replace("-", "_")


def search_config_from(args) -> SearchConfig:
    lookup_tokens = getattr(args, "lookup_tokens", None)
    if lookup_tokens is not None and lookup_tokens < 1:
        raise CliError("--lookup-tokens must be at least 1")
    budget = args.node_budget
    if budget in (None, "auto"):
        budget = default_search_config(getattr(args, "device", "cpu")).node_budget
    else:
        try:
            budget = int(budget)
        except ValueError:
            raise CliError(f"--node-budget takes a number or 'auto', got {args.node_budget!r}") from None
    knobs = {knob.name: getattr(args, _dest(knob)) for knob in search_knobs() if knob.name != "node_budget"}
    return SearchConfig(node_budget=budget, **knobs).validate()


def auto_budget_from(args) -> bool:
    """Whether DART's node budget is chosen as the run goes (--node-budget auto)."""
    return getattr(args, "node_budget", "auto") in (None, "auto")
