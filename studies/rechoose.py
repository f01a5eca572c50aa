"""Does re-choosing the automatic node budget every few steps pay, against one choice per run?

    python -m studies.rechoose --prompts 12 --rounds 2

Decodes ShareGPT dev prompts (from the end of the file, not the benchmark's) with dart_pld and the automatic budget,
once with the choice made again every RECHOOSE_EVERY steps (as shipped) and once with a single choice after the
first settled steps, alternating per prompt so that drift in machine speed falls on both alike; prints tokens per
second for each. Greedy: both produce the same tokens.
"""

from __future__ import annotations

import argparse
import sys
import time

from dart_core.budget.auto import RECHOOSE_EVERY
from dart_core.decoding import GenerationConfig, run
from dart_core.machine.hardware import detect
from dart_core.setup.chat import encode_prompt
from dart_core.setup.datasets import iter_sharegpt
from dart_core.setup.defaults import default_search_config
from dart_core.setup.loading import DraftSettings, load

NEVER = 10**9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.rechoose")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args(argv)
    loaded = load("default")
    print(f"{detect().describe()} · {loaded.dtype}", flush=True)
    firsts = [c[0]["content"] for c in iter_sharegpt()
              if c[0]["role"] == "user" and 20 <= len(c[0]["content"]) <= 1500]
    prompts = firsts[-(args.prompts + 28):-28]   # clear of the last 24+ that studies/tune_search.py records
    shipped = RECHOOSE_EVERY
    totals = {shipped: [0, 0.0], NEVER: [0, 0.0]}
    for r in range(args.rounds):
        for text in prompts:
            ids = encode_prompt(loaded.target.tokenizer, text)
            for every in (shipped, NEVER) if r % 2 == 0 else (NEVER, shipped):
                settings = DraftSettings(default_search_config(), auto_budget=True, rechoose_every=every)
                proposer = loaded.proposer("dart_pld", settings)
                t0 = time.perf_counter()
                trace = run(loaded.target, proposer, ids,
                            GenerationConfig(max_new_tokens=args.max_new_tokens, stop_ids=loaded.stop_ids))
                totals[every][0] += len(trace.output_ids)
                totals[every][1] += time.perf_counter() - t0
    for every, (tokens, seconds) in totals.items():
        label = f"every {every} steps" if every != NEVER else "once per run"
        print(f"choice {label}: {tokens / seconds:.2f} tok/s ({tokens} tokens in {seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
