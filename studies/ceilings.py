"""How far the C layer's products are from this machine's ceilings: the read bandwidth (a one-row forward reads every
weight once) and the FMA rate (each further row adds its arithmetic). Where the model's weights are Q4_1 blocks (the
default's), the same products reading those blocks too.

    python -m studies.ceilings                 # the default model, rows 1, 8, 16, 32
    python -m studies.ceilings --rows 1,9 --rounds 20
    python -m studies.ceilings --small-pages   # the weights (and the read) on 4 KB pages

Prints: the bytes of the model's decoder linears read by plain vector loads on the threads torch uses
(studies/read_bandwidth.c, built here with the C compiler), the same bytes as our products of k rows (the median of
--rounds, the weights cold: each round streams them all; up to 8 rows each way of reading them the calibration
times, dart_core/machine/few_rows.c), and the products' rate warm (one weight that the cores' caches hold,
repeated), from which the least time each further row can add.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from dart_core.machine import huge_pages
from dart_core.machine.few_rows import Reading
from dart_core.machine.hardware import kernels_here
from dart_core.setup.calibration import READING_WAYS
from dart_core.setup.loading import DEFAULT_MODEL, load_target

HERE = Path(__file__).resolve().parent
PASS_ROWS = 8   # few_rows.c: rows per pass over the weights


def build_reader(directory: Path) -> ctypes.CDLL:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler (cc) on this machine")
    lib = directory / "read_bandwidth.so"
    subprocess.run([compiler, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC",
                    str(HERE / "read_bandwidth.c"), "-o", str(lib)], check=True)
    reader = ctypes.CDLL(str(lib))
    reader.read_seconds.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_float)]
    reader.read_seconds.restype = ctypes.c_double
    return reader


def products_ms(kernel, packed, inputs, rounds: int) -> float:
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        for w, x in zip(packed, inputs):
            kernel.linear(x, w, None)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) * 1e3


def warm_gflops(kernel, weight: torch.Tensor, rows: int, batches: int = 8, repeats: int = 100) -> float:
    """The best rate of `batches` runs of `repeats` products (a busy machine only ever slows one down)."""
    packed, x = kernel.pack(weight), torch.randn(rows, weight.shape[1])
    best = float("inf")
    for i in range(batches + 1):
        t0 = time.perf_counter()
        for _ in range(repeats):
            kernel.linear(x, packed, None)
        if i:
            best = min(best, time.perf_counter() - t0)
    return 2 * rows * weight.numel() * repeats / best / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rows", default="1,8,16,32")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--small-pages", action="store_true", help="no huge pages (dart_core.machine.huge_pages)")
    args = ap.parse_args(argv)
    huge_pages.use(not args.small_pages)
    rows = [int(r) for r in args.rows.split(",")]
    target = load_target(args.model, dtype="fp32")
    kernel = kernels_here()
    if kernel is None or target.lean is None:
        raise SystemExit("our C kernels are not built on this machine: nothing to measure")
    threads = torch.get_num_threads()
    print(target.hardware.describe())
    linears = [lin for w in target.lean.layers for lin in (w.qkv, w.o, w.gate_up, w.down)]
    packed = [kernel.pack(lin.weight.detach().float()) for lin in linears]
    blocks = [kernel.pack_q4_1(lin.weight.detach().float()) for lin in linears]
    blocks = blocks if all(b is not None for b in blocks) else None
    size = sum(p.blocks.numel() * p.blocks.element_size() for p in packed)
    flops_per_row = 2 * sum(lin.weight.numel() for lin in linears)
    with tempfile.TemporaryDirectory() as tmp:
        checksum = ctypes.c_float()
        read = build_reader(Path(tmp)).read_seconds(size, threads, args.rounds, int(huge_pages.in_use()),
                                                    ctypes.byref(checksum)) * 1e3
    print(f"the decoder's linears: {size / 1e6:.0f} MB, {flops_per_row / 1e6:.0f} MFLOP a row, {threads} threads, "
          f"{'huge' if huge_pages.in_use() else 'small'} pages")
    print(f"read by plain loads: {read:.2f} ms ({size / read / 1e6:.1f} GB/s)")
    block_mb = sum(b.blocks.nbytes for b in blocks) / 1e6 if blocks is not None else 0.0
    for r in rows:
        inputs = [torch.randn(r, lin.in_features) for lin in linears]
        for name, reading in READING_WAYS.items():
            if r > PASS_ROWS and name != "ahead":
                continue   # passes of more rows always prefetch, several blocks at a time
            reading.apply(kernel)
            ms = products_ms(kernel, packed, inputs, args.rounds)
            print(f"our products, {r:3d} rows, {name:>10}: {ms:6.2f} ms ({read / ms:.0%} of the read's speed)")
            if blocks is not None:
                ms = products_ms(kernel, blocks, inputs, args.rounds)
                print(f"our products, {r:3d} rows, {name:>10}, Q4_1 blocks ({block_mb:.0f} MB): {ms:6.2f} ms")
    Reading().apply(kernel)
    weight = linears[0].weight.detach().float()
    rates = {r: warm_gflops(kernel, weight, r) for r in (8, 16, 32)}
    best = max(rates.values())
    print("warm, " + ", ".join(f"{r} rows {g:.0f} GFLOP/s" for r, g in rates.items()) +
          f": each further row adds at least {flops_per_row / best / 1e6:.2f} ms of arithmetic")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
