"""Decoding under a few setups in one process, alternating per prompt (so a machine's swings hit every setup alike):
DART at fixed node budgets beside the automatic one, the C layer's weights on huge pages against small ones, the
search's beam width and tokens a row at one fixed budget, or the C layer's products prefetching ahead from a few rows
on.

    python -m studies.alternate budgets --budgets 5,8,11,15,23     # dart: fixed budgets and auto, beside vanilla
    python -m studies.alternate pages --methods vanilla,dart       # weights on huge pages or on 4 KB pages
    python -m studies.alternate beams --budget 8 --beams 20x25,8x25,8x12   # beam width x top-k, beside vanilla
    python -m studies.alternate readings --readings 1,2 --methods vanilla   # prefetching from 1 row, from 2 rows

The default model in fp32, greedy, 128 new tokens, 4 MT-bench and 4 HumanEval prompts (--prompts N each). Prints each
setup's tokens/s, τ, verified rows a step and its ratio to the first setup, and whether every output was the same.
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import time

from dart_core.decoding import GenerationConfig, run
from dart_core.lean_native import NativeLayers
from dart_core.machine import huge_pages
from dart_core.machine.few_rows import Reading
from dart_core.setup.chat import encode_prompt
from dart_core.setup.datasets import humaneval_prompts, mtbench_prompts
from dart_core.setup.defaults import default_search_config
from dart_core.setup.loading import DraftSettings, load


def automatic(loaded, method: str) -> tuple:
    """(proposer, None): `method` with the default search and the automatic node budget."""
    return loaded.proposer(method, DraftSettings(default_search_config(), True)), None


def fixed(loaded, method: str, **knobs) -> tuple:
    """(proposer, None): `method` with the default search but `knobs` (SearchConfig's fields), the budget fixed."""
    return loaded.proposer(method, DraftSettings(dataclasses.replace(default_search_config(), **knobs), False)), None


def budget_setups(loaded, method: str, budgets: list[int]) -> dict:
    """(proposer, None) per setup: vanilla, the automatic budget, then each fixed one."""
    return {"vanilla": automatic(loaded, "vanilla"), f"{method}, auto": automatic(loaded, method),
            **{f"{method}, {b} nodes": fixed(loaded, method, node_budget=b) for b in budgets}}


def page_setups(loaded, methods: list[str]) -> dict:
    """(proposer, C layer) per method and page size: the target's C layer packed again on each."""
    target, current = loaded.target, loaded.target.lean.native
    layers = {}
    for pages, on in (("small pages", False), ("huge pages", True)):
        previous = huge_pages.use(on)
        layers[pages] = NativeLayers(target.lean, current.kernel)
        huge_pages.use(previous)
        layers[pages].greedy_rows, layers[pages].greedy.tile_rows = current.greedy_rows, current.greedy.tile_rows
    return {f"{m}, {pages}": (automatic(loaded, m)[0], native) for m in methods for pages, native in layers.items()}


def beam_setups(loaded, method: str, budget: int, beams: list[tuple[int, int]]) -> dict:
    """(proposer, None) per setup: vanilla, then `method` at `budget` nodes under each (beam width, tokens a row)."""
    return {"vanilla": automatic(loaded, "vanilla"),
            **{f"{method}, {budget} nodes, beam {w} x {k}": fixed(loaded, method, node_budget=budget, beam_width=w,
                                                                   topk=k) for w, k in beams}}


def reading_setups(loaded, methods: list[str], readings: list[int]) -> dict:
    """(proposer, C layer) per method and reading: the target's C layer as it is, its products prefetching ahead
    from `k` rows (few_rows.Reading)."""
    current = loaded.target.lean.native
    layers = {}
    for k in readings:
        layers[k] = copy.copy(current)   # the same packed weights; a reading of its own
        layers[k].reading = Reading(k)
    return {f"{m}, prefetching from {k} rows": (automatic(loaded, m)[0], native) for m in methods
            for k, native in layers.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("compare", choices=["budgets", "pages", "beams", "readings"])
    ap.add_argument("--method", default="dart", help="budgets: the method whose budget is fixed")
    ap.add_argument("--budgets", default="5,8,11,15,23")
    ap.add_argument("--methods", default="vanilla,dart", help="pages: the methods compared")
    ap.add_argument("--budget", type=int, default=8, help="beams: the fixed node budget")
    ap.add_argument("--beams", default="20x25,8x25,8x12", help="beams: beam width x tokens a row, each setup")
    ap.add_argument("--readings", default="1,2", help="readings: prefetching ahead from this many rows, each setup")
    ap.add_argument("--prompts", type=int, default=4)
    args = ap.parse_args(argv)
    loaded = load(dtype="fp32")
    target = loaded.target
    if target.forward_kind != "lean-native":
        raise SystemExit("our C layer does not decode here: nothing to compare")
    prompts = mtbench_prompts()[: args.prompts] + humaneval_prompts()[: args.prompts]
    ids = [encode_prompt(target.tokenizer, p.text) for p in prompts]
    if args.compare == "budgets":
        setups = budget_setups(loaded, args.method, [int(b) for b in args.budgets.split(",")])
    elif args.compare == "pages":
        setups = page_setups(loaded, args.methods.split(","))
    elif args.compare == "readings":
        setups = reading_setups(loaded, args.methods.split(","), [int(k) for k in args.readings.split(",")])
    else:
        beams = [tuple(int(v) for v in spec.split("x")) for spec in args.beams.split(",")]
        setups = beam_setups(loaded, args.method, args.budget, beams)
    config = GenerationConfig(max_new_tokens=128, stop_ids=loaded.stop_ids)
    print(target.hardware.describe())
    seconds, tokens, steps, rows = (collections.Counter() for _ in range(4))
    outputs = collections.defaultdict(set)
    own = target.lean.native
    for name, (proposer, native) in setups.items():   # a warm-up each
        target.lean.native = native or own
        run(target, proposer, ids[0], config)
    for prompt in ids:
        for name, (proposer, native) in setups.items():
            target.lean.native = native or own
            t0 = time.perf_counter()
            trace = run(target, proposer, prompt, config)
            seconds[name] += time.perf_counter() - t0
            tokens[name] += len(trace.output_ids)
            steps[name] += len(trace.steps) - 1
            rows[name] += sum(len(s.tree) for s in trace.steps[1:])
            outputs[tuple(prompt)].add(tuple(trace.output_ids))
    target.lean.native = own
    first = next(iter(setups))
    for name in setups:
        rate = tokens[name] / seconds[name]
        print(f"{name:24s} {rate:6.1f} tokens/s  τ {tokens[name] / steps[name]:.2f}  "
              f"{rows[name] / steps[name]:4.1f} rows a step  {rate / (tokens[first] / seconds[first]):.3f}x")
    print("every output the same:", all(len(v) == 1 for v in outputs.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
