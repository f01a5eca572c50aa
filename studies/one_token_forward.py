"""Our one-token forward against transformers' own and `generate`'s, on this machine (fp32, 256 cached tokens).

Where DART's plain step starts against `generate` decides how much τ it needs to win: on a CPU where our measured
kernels beat torch's default GEMM for one row, DART starts ahead; where they do not, its gain is τ alone.

    python -m studies.one_token_forward [--repeats 3]

Prints, per repeat (the spread between repeats is the machine's noise): our verify of one token with the measured
kernel plan (decoder linears and output layer), the same on torch's default kernels, transformers' forward with its
cache, and `generate` per token.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dart_core.machine.hardware import detect
from dart_core.setup.loading import load_target
from dart_core.tree import TokenTree

CONTEXT = 256


def median_ms(run, reps: int = 40, warmup: int = 5) -> float:
    times = []
    for r in range(reps + warmup):
        t0 = time.perf_counter()
        run()
        if r >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def ours(target, ids: list[int]) -> float:
    cache = target.new_cache()
    target.prefill(ids, cache)
    tree = TokenTree.chain(ids[-1], [])

    def step():
        target.verify(tree, cache)
        target.rollback(cache, CONTEXT)
    return median_ms(step)


@torch.inference_mode()
def transformers_forward(model, ids: list[int]) -> float:
    from transformers import DynamicCache

    from dart_core.target import cache_argument
    cache = DynamicCache(config=model.config)
    kw = cache_argument(model)
    model(input_ids=torch.tensor([ids]), **{kw: cache}, use_cache=True)
    last, pos = torch.tensor([[ids[-1]]]), torch.tensor([[CONTEXT]])

    def step():
        model(input_ids=last, position_ids=pos, **{kw: cache}, use_cache=True)
        cache.crop(-1)
    return median_ms(step)


@torch.inference_mode()
def generate_per_token(model, ids: list[int], n: int = 64) -> float:
    x = torch.tensor([ids])
    model.generate(x, max_new_tokens=4, do_sample=False)
    t0 = time.perf_counter()
    model.generate(x, max_new_tokens=1, do_sample=False)
    one = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return (time.perf_counter() - t0 - one) / (n - 1) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    target = load_target()
    print(detect("cpu").describe())
    ids = [i % target.vocab_size for i in range(100, 100 + CONTEXT)]
    for r in range(args.repeats):
        with_plan = ours(target, ids)
        kernels, target.fast_linears = target.fast_linears, None
        plain = ours(target, ids)
        target.fast_linears = kernels
        print(f"repeat {r + 1}: ours {with_plan:.1f} ms (the measured kernel plan), ours without it "
              f"{plain:.1f} ms, transformers' forward {transformers_forward(target.model, ids):.1f} ms, generate "
              f"{generate_per_token(target.model, ids):.1f} ms a token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
