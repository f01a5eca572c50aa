"""One target forward of k rows, timed on each forward the engine has, at a few context lengths.

    python -m studies.step_times                       # the default model, k = 1, 4, 8, 16, contexts 16, 256, 512
    python -m studies.step_times --rows 1,2,4,8 --contexts 256 --forwards lean-native,lean
    python -m studies.step_times --dtype bf16 --contexts 256 --forwards lean-native,lean-native-fma --greedy

Forwards: `lean-native` (the C layer, dart_core/lean_native.py; a bf16 model's products from tiles where this CPU
has a way: AMX, else AVX512-BF16), `lean-native-fma` (the C layer, a bf16 model's products by FMAs on its widened
weights), `lean-native-dots` (by AVX512-BF16 from tiles, written out where the build has none), `lean` (the lean
forward as torch operations, with the measured kernel plan), `transformers`. Prints ms per forward, the best of
--rounds after a warm-up. --greedy times a greedy verify of k rows instead (the target's choice per row, as greedy
decoding asks for it: from the output layer's copy where the C layer has one) of a forward returning every logit.
"""

from __future__ import annotations

import argparse
import time

import torch

from dart_core.machine.records import BF16_PRODUCTS
from dart_core.setup.calibration import kernel_plan
from dart_core.setup.loading import DEFAULT_MODEL, load_target
from dart_core.tree import TokenTree


def forward_time(target, context: int, rows: int, rounds: int, greedy: bool = False) -> float:
    cache = target.new_cache(context + rows + 1)
    with torch.inference_mode():
        target.prefill([(i * 7) % 40000 + 100 for i in range(context)], cache)
        ids, positions = torch.full((rows,), 42), torch.arange(context, context + rows)
        chain = TokenTree.chain(42, [42] * (rows - 1))
        best = float("inf")
        for i in range(rounds + 1):
            target.rollback(cache, context)
            t0 = time.perf_counter()
            if greedy:
                target.verify(chain, cache, choices=True)
            else:
                target.forward(ids, positions, cache)
            if i:
                best = min(best, time.perf_counter() - t0)
    target.release(cache)
    return best * 1e3


# each forward: the one decoding runs (TargetModel.forward_kind) and, in the C layer, how a bf16 model's products run
# (None: as amx_tiles.bf16_way chooses)
FORWARDS = {"lean-native": ("lean-native", None), "lean-native-fma": ("lean-native", "off"),
            "lean-native-dots": ("lean-native", "avx512-bf16"), "lean": ("lean", None),
            "transformers": ("transformers", None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--contexts", default="16,256,512")
    ap.add_argument("--forwards", default="lean-native,lean,transformers")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--greedy", action="store_true", help="a greedy verify of k rows, not a forward's logits")
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    unknown = sorted(set(args.forwards.split(",")) - FORWARDS.keys())
    if unknown:
        ap.error(f"unknown forward {', '.join(unknown)}: one of {', '.join(FORWARDS)}")
    target = load_target(args.model, dtype=args.dtype)
    print(target.hardware.describe(), args.dtype)
    for forward in args.forwards.split(","):
        kind, tiles = FORWARDS[forward]
        target.use_lean(kind != "transformers", graphs=kind == "lean-native", tiles=tiles)
        target.use_kernels(kernel_plan(target))
        if target.forward_kind != kind:
            print(f"{forward}: not available here (decoding runs {target.forward_kind})")
            continue
        if kind == "lean-native" and args.dtype == "bf16":
            print(f"{forward}: products {BF16_PRODUCTS.get(target.bf16_tiles, 'by FMAs')}")
        for context in (int(c) for c in args.contexts.split(",")):
            times = "  ".join(f"t({k}) {forward_time(target, context, k, args.rounds, args.greedy):6.2f}" for k in rows)
            print(f"{forward:<12} context {context:4d}: {times}  ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
