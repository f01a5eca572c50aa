"""What the automatic budget's choices cost, step by step, where trees hardly pay: the verify cost curve against the
verifies decoding makes, and DART's drafted and plain steps against our plain lane.

    python -m studies.budget_steps order                     # a one-row verify after its own size, after a larger one
    python -m studies.budget_steps steps --methods dart,dart_pld --prompts 4

`order`: after 256 tokens, the median of one-row verifies run back to back, and of one-row verifies each right after
a verify of --after rows (the cost curve times each size after one of its own: dart_core/setup/calibration.py).
`steps`: the default model in fp32, greedy, 128 new tokens, MT-bench and HumanEval prompts (--prompts N each), vanilla
and each method alternating per prompt; prints tokens/s without the prompts' prefill, each method's ratio to vanilla,
its steps by kind (plain, the lookup branch alone, drafted: probes and trees; ms a token, verify and propose in
all) and by tree size (verify and propose ms, tokens a step), the seconds outside its steps (a decode's set-up, the
loop's books), and the choices its automatic budget made.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import torch

from dart_core.decoding import GenerationConfig, run
from dart_core.setup.chat import encode_prompt
from dart_core.setup.datasets import humaneval_prompts, mtbench_prompts
from dart_core.setup.defaults import default_search_config
from dart_core.setup.loading import DraftSettings, load
from dart_core.tree import TokenTree


@torch.inference_mode()
def order(target, after: int, repeats: int, context: int = 256) -> None:
    cache = target.new_cache()
    ids = [i % target.vocab_size for i in range(100, 100 + context)]
    target.prefill(ids, cache)

    def verify(rows: int) -> float:
        t0 = time.perf_counter()
        target.verify(TokenTree.chain(ids[-1], ids[:rows - 1]), cache, choices=True)
        seconds = time.perf_counter() - t0
        target.rollback(cache, context)
        return seconds
    for _ in range(20):
        verify(1)
    for _ in range(2):   # twice, alternating
        alone = [verify(1) for _ in range(repeats)]
        following = [(verify(after), verify(1))[1] for _ in range(repeats)]
        print(f"one row after one row: {np.median(alone) * 1e3:.2f} ms; right after {after} rows: "
              f"{np.median(following) * 1e3:.2f} ms (medians of {repeats})")


def steps(loaded, methods: list[str], prompts: int) -> None:
    target = loaded.target
    chosen = mtbench_prompts()[:prompts] + humaneval_prompts()[:prompts]
    ids = [encode_prompt(target.tokenizer, p.text) for p in chosen]
    config = GenerationConfig(max_new_tokens=128, stop_ids=loaded.stop_ids)
    names = ["vanilla"] + methods
    proposers = {m: loaded.proposer(m, DraftSettings(default_search_config(), True)) for m in names}
    for m in names:   # a warm-up each, not counted
        run(target, proposers[m], ids[0], config)
    seconds, tokens = collections.Counter(), collections.Counter()
    by_size = {m: collections.defaultdict(list) for m in names}
    by_kind = {m: collections.defaultdict(lambda: [0, 0, 0.0]) for m in names}   # steps, tokens, seconds
    outside = collections.Counter()
    choices = {m: collections.Counter() for m in names}
    for prompt in ids:
        for m in names:
            t0 = time.perf_counter()
            trace = run(target, proposers[m], prompt, config)
            seconds[m] += time.perf_counter() - t0 - trace.steps[0].timings["prefill"]
            tokens[m] += len(trace.output_ids)
            outside[m] += time.perf_counter() - t0 - sum(sum(s.timings.values()) for s in trace.steps)
            for s in trace.steps[1:]:
                t = s.timings
                by_size[m][len(s.tree)].append((t["verify"], t.get("draft", 0) + t.get("search", 0), len(s.new_tokens)))
                kind = by_kind[m][step_kind(s)]
                kind[0], kind[1], kind[2] = kind[0] + 1, kind[1] + len(s.new_tokens), kind[2] + sum(t.values())
                if s.budget is not None and s.budget.choice is not None:
                    choices[m][s.budget.choice.budget] += 1
    plain = tokens["vanilla"] / seconds["vanilla"]
    for m in names:
        rate = tokens[m] / seconds[m]
        print(f"{m}: {rate:.1f} tokens/s without the prefill, {rate / plain:.3f}x vanilla; outside its steps "
              f"{outside[m]:.2f} s")
        for kind, (n, got, spent) in sorted(by_kind[m].items()):
            print(f"  {kind:10s} {n:5d} steps, {got:5d} tokens, {spent / got * 1e3:.2f} ms a token")
        for size in sorted(by_size[m]):
            a = np.array(by_size[m][size])
            print(f"  {size:3d} rows: {len(a):5d} steps, verify {np.median(a[:, 0]) * 1e3:.2f} ms, propose "
                  f"{a[:, 1].mean() * 1e3:.2f} ms, {a[:, 2].mean():.2f} tokens a step")
        if choices[m]:
            print("  steps under each chosen budget (0: plain decoding):", dict(sorted(choices[m].items())))


def step_kind(step) -> str:
    """'drafted' (a probe or a tree), 'alone' (the lookup branch alone, nothing drafted) or 'plain'."""
    if step.rows_tokens is not None:
        return "drafted"
    return "alone" if len(step.tree) > 1 else "plain"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["order", "steps"])
    ap.add_argument("--after", type=int, default=64, help="order: the larger verify's rows")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--methods", default="dart,dart_pld")
    ap.add_argument("--prompts", type=int, default=4, help="steps: MT-bench and HumanEval prompts, this many of each")
    args = ap.parse_args(argv)
    loaded = load(dtype="fp32")
    print(loaded.target.hardware.describe())
    if args.what == "order":
        order(loaded.target, args.after, args.repeats)
    else:
        steps(loaded, args.methods.split(","), args.prompts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
