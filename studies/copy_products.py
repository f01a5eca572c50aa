"""The output copy's product each way this CPU has, side by side: fp32 FMAs on the widened int8 copy, its integer sums
by AVX-512 VNNI, and on AMX tiles (dart_core/greedy_output.py, machine/int8_tiles.c).

    python -m studies.copy_products                   # the default model; 1 to 32 rows
    python -m studies.copy_products --rows 1,8,16 --rounds 25
    python -m studies.copy_products --build avx2-vnni  # the C layer as an AVX2 CPU with AVX-VNNI builds it

Two tables, median ms: the greedy choice alone (x of k random rows, every way giving the same choices), and a whole
greedy verify of k rows after a context of 256 with the C layer (calibration's interleaved passes), where the layers
before the output have streamed their weights through the caches, as in decoding.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dart_core.greedy_output import GreedyOutput
from dart_core.lean_native import GREEDY_COPY, NativeLayers
from dart_core.machine import amx_tiles, few_rows
from dart_core.setup.calibration import _verify_times
from dart_core.setup.loading import load_target
from dart_core.setup.models import DEFAULT_MODEL


def ways_here(kernel) -> list[str]:
    """The ways this machine runs: "fma" always, "vnni" and "amx" where built and usable."""
    return ["fma"] + (["vnni"] if amx_tiles.vnni_usable(kernel) else []) + (["amx"] if amx_tiles.usable(kernel) else [])


def copies(weight: torch.Tensor, kernel, ways: list[str]) -> dict[str, GreedyOutput]:
    """A copy per way; "fma" is a copy with tiles that never uses them."""
    out = {w: GreedyOutput(weight, kernel, GREEDY_COPY, "off" if w == "fma" else w) for w in ways}
    for way, copy in out.items():
        copy.tile_rows = None if way == "fma" else 1
    return out


def choice_alone(copies_by_way: dict, k: int, rows: list[int], rounds: int) -> dict[str, list[float]]:
    gen = torch.Generator().manual_seed(0)
    times = {way: {r: [] for r in rows} for way in copies_by_way}
    for _ in range(rounds):
        for r in rows:
            x = torch.randn(r, k, generator=gen) * 2
            chosen = []
            for way, copy in copies_by_way.items():
                t0 = time.perf_counter()
                chosen.append(copy.choose(x))
                times[way][r].append(time.perf_counter() - t0)
            if not all(torch.equal(chosen[0], c) for c in chosen[1:]):
                raise AssertionError(f"the ways chose differently at {r} rows")
    return {way: [float(np.median(ts[r])) for r in rows] for way, ts in times.items()}


def in_a_verify(target, copies_by_way: dict, rows: list[int], rounds: int) -> dict[str, list[float]]:
    native = target.lean.native
    kept = native.greedy, native.greedy_rows
    native.greedy_rows = native.max_rows

    def way(copy):
        def set_up():
            native.greedy = copy
        return set_up
    try:
        _, medians = _verify_times(target, tuple(rows), 256, rounds, {w: way(c) for w, c in copies_by_way.items()})
    finally:
        native.greedy, native.greedy_rows = kept
    return medians


def table(title: str, rows: list[int], medians: dict[str, list[float]]) -> str:
    lines = [title, "| way | " + " | ".join(f"k = {r}" for r in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    lines += [f"| {way} | " + " | ".join(f"{t * 1e3:.2f}" for t in ts) + " |" for way, ts in medians.items()]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,4,8,12,16,32")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--build", help="the kernels built as for this kind (dart_core/machine/few_rows.py's MARCH, "
                                        "e.g. avx2-vnni) instead of for this machine")
    args = parser.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    target = load_target(DEFAULT_MODEL, "cpu", "fp32", False)
    native = target.lean.native if target.lean is not None else None
    if native is None or native.greedy is None:
        raise SystemExit("no C layer with an output copy here: nothing to compare")
    if args.build:
        kernel = few_rows.kernel(args.build)
        if kernel is None:
            raise SystemExit(f"the {args.build} build: {few_rows.why_not(args.build)}")
        native = target.lean.native = NativeLayers(target.lean, kernel)
    ways = ways_here(native.kernel)
    by_way = copies(target.lean.output.weight, native.kernel, ways)
    print(f"ways here: {', '.join(ways)}; {torch.get_num_threads()} threads; the {args.build or 'native'} build")
    print(table("The greedy choice alone, ms", rows, choice_alone(by_way, target.lean.output.weight.shape[1], rows,
                                                                   args.rounds)))
    print(table("A greedy verify after 256 tokens, ms", rows, in_a_verify(target, by_way, rows, args.rounds)))


if __name__ == "__main__":
    main()
