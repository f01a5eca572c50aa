"""One target forward of k rows, timed on each forward the engine has, at a few context lengths.

    python -m studies.step_times                       # the default model, k = 1, 4, 8, 16, contexts 16, 256, 512
    python -m studies.step_times --rows 1,2,4,8 --contexts 256 --forwards lean-native,lean

Forwards: `lean-native` (the C layer, dart_core/lean_native.py), `lean` (the lean forward as torch operations, with
the measured kernel plan), `transformers`. Prints ms per forward, the best of --rounds after a warm-up.
"""

from __future__ import annotations

import argparse
import time

import torch

from dart_core.setup.calibration import kernel_plan
from dart_core.setup.loading import DEFAULT_MODEL, load_target


def forward_time(target, context: int, rows: int, rounds: int) -> float:
    cache = target.new_cache(context + rows + 1)
    with torch.inference_mode():
        target.prefill([(i * 7) % 40000 + 100 for i in range(context)], cache)
        ids, positions = torch.full((rows,), 42), torch.arange(context, context + rows)
        best = float("inf")
        for i in range(rounds + 1):
            target.rollback(cache, context)
            t0 = time.perf_counter()
            target.forward(ids, positions, cache)
            if i:
                best = min(best, time.perf_counter() - t0)
    target.release(cache)
    return best * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--contexts", default="16,256,512")
    ap.add_argument("--forwards", default="lean-native,lean,transformers")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    target = load_target(args.model, dtype="fp32")
    print(target.hardware.describe())
    for forward in args.forwards.split(","):
        target.use_lean(forward != "transformers", graphs=forward == "lean-native")
        target.use_kernels(kernel_plan(target))
        if target.forward_kind != forward:
            print(f"{forward}: not available here (decoding runs {target.forward_kind})")
            continue
        for context in (int(c) for c in args.contexts.split(",")):
            times = "  ".join(f"t({k}) {forward_time(target, context, k, args.rounds):6.2f}" for k in rows)
            print(f"{forward:<12} context {context:4d}: {times}  ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
