"""The verify cost curve and a prompt's prefill as this checkout's build of the C layer computes them: run it in each
of two checkouts (or before and after a change to dart_core/machine/*.c), alternating, to compare their kernels on
the whole forward. The kernels are built and cached per source, so each checkout runs its own.

    python -m studies.verify_curve                       # the default model, fp32
    python -m studies.verify_curve --rows 1,8,9,16,64 --rounds 9

Prints the median seconds of a greedy verify of k rows after the calibration's context (what the automatic budget
weighs, setup/calibration.py: measure_cost_curve) and the best of --rounds prefills of a few prompt lengths through the
C layer and through torch's step (measure_prefill: what the first load chooses between).
"""

from __future__ import annotations

import argparse

from dart_core.setup.calibration import measure_cost_curve, measure_prefill
from dart_core.setup.loading import DEFAULT_MODEL, load_target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rows", default="1,4,8,9,12,16,24,32,64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", default="64,128,384", help="prompt lengths to prefill")
    args = ap.parse_args(argv)
    target = load_target(args.model, dtype="fp32")
    if target.lean is None or target.lean.native is None:
        raise SystemExit("no C layer on this machine: nothing to measure")
    print(target.hardware.describe())
    rows = tuple(int(r) for r in args.rows.split(","))
    curve = measure_cost_curve(target, rows=rows, rounds=args.rounds)
    print("verify, ms: " + ", ".join(f"{k} rows {t * 1e3:.1f}" for k, t in zip(curve.rows, curve.measured)))
    lengths = tuple(int(k) for k in args.prompts.split(","))
    prefill = measure_prefill(target, rows=lengths, rounds=args.rounds)
    for k, ours, torch_step in zip(prefill["rows"], prefill["C layer"], prefill["torch"]):
        print(f"prefill of {k} tokens: C layer {ours * 1e3:.0f} ms, torch's step {torch_step * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
