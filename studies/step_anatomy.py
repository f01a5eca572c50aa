"""Where a decode step's time goes, part by part, inside decoding: each part of the engine timed where it runs.

    python -m studies.step_anatomy                                  # vanilla and dart, 3 + 3 prompts, 2 rounds
    python -m studies.step_anatomy --methods dart --search-threads 1,2   # the tree search on 1 or 2 threads

The default model in fp32, greedy, 128 new tokens, MT-bench and HumanEval prompts (--prompts N each), the methods
alternating per prompt (so a machine's swings hit each alike). The engine's own functions are wrapped with a clock:
the C layer's forward and its layers, the output layer's greedy choice, the draft head's step and top rows, the tree
search (and the C search inside it), the automatic budget's books, the tree mask, acceptance and the cache's commit.
Parts nest (the layers are inside the forward, the forward inside the verify), so they do not add up. Prints ms a
verify step for each part, and with --search-threads the search's ms a step on each thread count, alternating per
prompt.
"""

from __future__ import annotations

import argparse
import collections
import functools
import time

from dart_core import decoding, draft_native, greedy_output, lean_native, proposers, tree_search_native
from dart_core.budget.auto import AutoBudget
from dart_core.decoding import GenerationConfig, run
from dart_core.setup.chat import encode_prompt
from dart_core.setup.datasets import humaneval_prompts, mtbench_prompts
from dart_core.setup.defaults import default_search_config
from dart_core.setup.loading import DraftSettings, load
from dart_core.target import TargetModel
from dart_core.tree import TokenTree

PARTS = [(TargetModel, "verify", "verify"), (lean_native.NativeLayers, "forward", "  the C layer's forwards (and prompts')"),
         (lean_native.NativeLayers, "_layers", "    its layers"),
         (greedy_output.GreedyOutput, "choose", "    the output layer's choice"),
         (TokenTree, "ancestor_mask", "  the tree mask"), (proposers.DartProposer, "propose", "propose"),
         (draft_native.NativeDraftHead, "step", "  the draft head's step"),
         (draft_native.NativeDraftHead, "top_rows", "  its top rows"), (proposers, "search", "  the tree search"),
         (tree_search_native, "beam_search", "    the C search"), (AutoBudget, "budget_for", "  the budget's books"),
         (decoding, "accept_choices", "accept"), (TargetModel, "commit", "commit")]


def clocked(owner, name: str, label: str, add):
    """Wrap owner.name so that its time goes to add(label, seconds) (a static method stays one)."""
    raw = owner.__dict__[name]
    f = raw.__func__ if isinstance(raw, staticmethod) else raw

    @functools.wraps(f)
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            add(label, time.perf_counter() - t0)

    setattr(owner, name, staticmethod(timed) if isinstance(raw, staticmethod) else timed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default="vanilla,dart")
    ap.add_argument("--prompts", type=int, default=3, help="MT-bench and HumanEval prompts, this many of each")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--search-threads", default="", help="e.g. 1,2: the C search on each, alternating per prompt")
    args = ap.parse_args(argv)
    loaded = load(dtype="fp32")
    target = loaded.target
    prompts = mtbench_prompts()[: args.prompts] + humaneval_prompts()[: args.prompts]
    ids = [encode_prompt(target.tokenizer, p.text) for p in prompts]
    config = GenerationConfig(max_new_tokens=128, stop_ids=loaded.stop_ids)
    methods = args.methods.split(",")
    threads = [int(t) for t in args.search_threads.split(",")] if args.search_threads else [None]
    setups = [(m, t) for m in methods for t in (threads if m != "vanilla" else [None])]
    proposers_ = {m: loaded.proposer(m, DraftSettings(default_search_config(), True)) for m in methods}
    seconds: dict = {s: collections.Counter() for s in setups}
    now = {"setup": setups[0]}
    for owner, name, label in PARTS:
        clocked(owner, name, label, lambda label, dt: seconds[now["setup"]].update({label: dt}))
    search_in_c = tree_search_native.beam_search
    wanted = {"threads": None}
    tree_search_native.beam_search = lambda *a, **k: search_in_c(*a, **{**k, "threads": wanted["threads"]})
    print(target.hardware.describe())
    for m in methods:   # a warm-up each, not counted
        run(target, proposers_[m], ids[0], config)
    for counter in seconds.values():
        counter.clear()
    steps, tokens, wall = collections.Counter(), collections.Counter(), collections.Counter()
    for _ in range(args.rounds):
        for prompt in ids:
            for setup in setups:
                now["setup"], wanted["threads"] = setup, setup[1]
                t0 = time.perf_counter()
                trace = run(target, proposers_[setup[0]], prompt, config)
                wall[setup] += time.perf_counter() - t0
                steps[setup] += len(trace.steps) - 1
                tokens[setup] += len(trace.output_ids)
    for setup in setups:
        name = setup[0] + (f", search on {setup[1]} threads" if setup[1] else "")
        print(f"{name}: {tokens[setup] / wall[setup]:.1f} tokens/s, τ {tokens[setup] / steps[setup]:.2f}, "
              f"{wall[setup] / steps[setup] * 1e3:.2f} ms a step (the prefill included)")
        for _, _, label in PARTS:
            if seconds[setup][label]:
                print(f"  {label:40s} {seconds[setup][label] / steps[setup] * 1e3:7.3f} ms a step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
