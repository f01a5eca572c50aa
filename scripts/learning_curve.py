"""The draft head's learning curve: held-out row-0 top-1 and chain tau against anchor tokens seen (log scale).

Every training run adds its evaluations to docs/results/learning-curve.json (one series per run, tokens counted from
the start of the head's whole lineage, so a run continued from a trained head starts where that head stopped), and
the script redraws docs/results/learning-curve.svg and rewrites the table and fit in docs/results/learning-curve.md
(docs/training.md reads them). A series only compares with series measured on the same held-out set (its `heldout`
name); the fit is made per held-out set.

    python -m scripts.learning_curve add runs/head5-cont --name "K=5 continued, chat+code" --heldout mix48-seed1
    python -m scripts.learning_curve draw

The fit: row-0 top-1 (and chain tau) linear in ln(tokens) over a set's heads at the end of a schedule (a run's
last evaluation when it reached its schedule's last step, and the step-0 evaluation of a run continued from a
trained head, which is that head's score), at 1M tokens and beyond, where the early, fast part of the curve is
over. Points inside a schedule are left out of the fit: there the learning rate's warm-up and decay move the
metrics as much as the data does (a continued run first dips, then climbs as its rate anneals). A straight line in
ln(tokens) is optimistic if the curve keeps bending down, so the tokens it predicts for a target are a lower bound.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
DATA, SVG, TABLE = RESULTS / "learning-curve.json", RESULTS / "learning-curve.svg", RESULTS / "learning-curve.md"
TARGETS = {"row0_top1": 0.50}                    # issue 21's held-out target
FIT_FROM = 1_000_000                             # tokens: fit only the slow part of the curve


def lineage_tokens(head_metrics: dict | None) -> int:
    """Anchor tokens seen by a head and every head it was continued from (each metrics.json nests the one before
    under "started_from")."""
    total = 0
    while head_metrics:
        total += int(head_metrics.get("tokens_seen") or 0)
        head_metrics = head_metrics.get("started_from")
    return total


def run_points(run: Path) -> tuple[list[dict], dict]:
    """(points, provenance) of a run folder: every held-out evaluation in its checkpoint, tokens counted from the
    start of the lineage. An evaluation records its tokens where the trainer wrote them; older ones are placed
    by their step (anchors per step are nearly constant within a run), and marked estimated. A branch of another
    run (`train --branch-from`) has only its own evaluations, after the step it branched at."""
    state = torch.load(run / "ckpt.pt", weights_only=False, map_location="cpu")
    saved = [run / name / "metrics.json" for name in ("end", "best") if (run / name / "metrics.json").is_file()]
    metrics = json.loads(saved[0].read_text()) if saved else {}   # the head at the schedule's end knows it best
    branched_at = (state.get("branched_from") or {}).get("step", -1)
    before = lineage_tokens(metrics.get("started_from"))
    per_step = state["tokens_seen"] / max(state["step"], 1)
    config = metrics.get("train_config") or {}
    schedule = config.get("max_steps")   # a run stopped before it did not anneal
    if config.get("schedule") == "time":   # it annealed by its time limit, if its last session ran that long
        spent = ((state.get("sessions") or [{}])[-1]).get("minutes", 0.0)
        schedule = state["step"] if spent >= 0.95 * (config.get("minutes") or 0) else schedule
    points = []
    for i, h in enumerate(state["history"]):
        if h["step"] <= branched_at:
            continue
        exact = "tokens_seen" in h
        tokens = h["tokens_seen"] if exact else round(h["step"] * per_step)
        last = i == len(state["history"]) - 1 and (schedule is None or h["step"] >= schedule)
        ended = last or (h["step"] == 0 and before > 0)   # a schedule's end (see fit)
        points.append({"step": h["step"], "tokens": before + int(tokens), "estimated": not exact, "endpoint": ended,
                       "row0_top1": h["row_top1"][0], "chain_tau": h["chain_tau"],
                       "top3_tau_bound": h.get("top3_tau_bound")})
    minutes = sum(s.get("minutes", 0.0) for s in state.get("sessions") or [])
    provenance = {"run": str(run), "command": (state.get("sessions") or [{}])[-1].get("command", ""),
                  "starting_tokens": before, "steps": state["step"], "tokens_seen": state["tokens_seen"],
                  "train_minutes": round(minutes, 1),
                  "anchor_tokens_per_s": round(state["tokens_seen"] / (minutes * 60)) if minutes else None}
    return points, provenance


def fit(points: list[dict], key: str) -> tuple[float, float] | None:
    """(a, b) of key = a + b ln(tokens) over the schedules' end points past FIT_FROM, or None with fewer than 2."""
    pts = [(math.log(p["tokens"]), p[key]) for p in points if p["tokens"] >= FIT_FROM and p.get("endpoint", True)]
    if len({x for x, _ in pts}) < 2:
        return None
    b, a = np.polyfit([x for x, _ in pts], [y for _, y in pts], 1)
    return float(a), float(b)


def tokens_for(line: tuple[float, float], value: float) -> float | None:
    a, b = line
    return math.exp((value - a) / b) if b > 0 else None


def fastest_run(data: dict) -> dict | None:
    """The series that trained fastest (anchor tokens per second over its sessions' wall time): the throughput the
    hours a target needs are counted at. A run that shared the machine is slower, so the fastest is the nearest to a
    quiet machine's rate."""
    timed = [s for s in data["series"] if s.get("anchor_tokens_per_s")]
    return max(timed, key=lambda s: s["anchor_tokens_per_s"], default=None)


def table(data: dict) -> str:
    out = ["# The draft head's learning curve", "",
           "Held-out row-0 top-1 and chain tau against anchor tokens seen, per training run (`scripts/learning_curve.py`"
           " writes this page, `learning-curve.json` and `learning-curve.svg` beside it; `docs/training.md` reads them). "
           "Tokens count the head's whole "
           "lineage; points marked * place an evaluation by its step; the fit reads only the heads at the end of a "
           "schedule (marked end). Runs compare only on the same held-out set.", "",
           "![learning curve](learning-curve.svg)", ""]
    for heldout, series in _by_heldout(data).items():
        out += [f"## Held-out set `{heldout}`", "", "| run | step | tokens seen | row-0 top-1 | chain tau | |",
                "|---|---|---|---|---|---|"]
        for s in series:
            for p in s["points"]:
                star = "*" if p.get("estimated") else ""
                end = "end" if p.get("endpoint", True) else ""
                out.append(f"| {s['name']} | {p['step']} | {p['tokens']:,}{star} | {p['row0_top1']:.3f} | "
                           f"{p['chain_tau']:.3f} | {end} |")
        pts = [p for s in series for p in s["points"]]
        for key in ("row0_top1", "chain_tau"):
            line = fit(pts, key)
            if line is None:
                out.append(f"\nFit of {key}: fewer than two points past {FIT_FROM:,} tokens.")
                continue
            a, b = line
            text = f"\nFit of {key} (schedules' ends past {FIT_FROM:,} tokens): {a:.3f} + {b:.4f} ln(tokens), " \
                   f"+{b * math.log(2):.3f} per doubling."
            if key in TARGETS:
                need = tokens_for(line, TARGETS[key])
                if need is None:
                    text += f" It does not rise: no token count reaches {TARGETS[key]}."
                else:
                    text += f" It reaches {TARGETS[key]} at {need:,.0f} tokens (at least: the curve bends down)"
                    fastest = fastest_run(data)
                    if fastest:
                        rate = fastest["anchor_tokens_per_s"]
                        text += (f", {need / rate / 3600:,.0f} hours at {rate} anchor tokens/s (the fastest run "
                                 f"here, {fastest['name']}: {fastest.get('cpu', 'its CPU unrecorded')})")
                    text += "."
            out.append(text)
        out.append("")
    if data.get("notes"):           # what the numbers say, written by whoever ran the last run (the json's "notes")
        out += ["## Reading it", "", *data["notes"], ""]
    return "\n".join(out)


def _by_heldout(data: dict) -> dict:
    groups: dict[str, list] = {}
    for s in data["series"]:
        groups.setdefault(s["heldout"], []).append(s)
    return groups


def svg(data: dict, width: int = 760) -> str:
    """Two panels (row-0 top-1, chain tau) against log10 tokens; one colour per series, the fit dashed, the
    target dotted; the legend below."""
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    pts = [p for s in data["series"] for p in s["points"]]
    x0 = math.floor(math.log10(min(p["tokens"] for p in pts if p["tokens"] > 0)))
    x1 = math.ceil(math.log10(max(max(p["tokens"] for p in pts), 1e9)))
    panels = [("row0_top1", "row-0 top-1 (held-out)", 0.0, 0.6), ("chain_tau", "chain tau (held-out)", 1.0, 1.8)]
    pw, ph, left, top = (width - 130) / 2, 280, 50, 30
    height = top + ph + 44 + 14 * len(data["series"])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><rect width="100%" height="100%" fill="white"/>']
    for i, (key, title, lo, hi) in enumerate(panels):
        ox = left + i * (pw + 50)

        def sx(t):
            return ox + (math.log10(t) - x0) / (x1 - x0) * pw

        def sy(v):
            return top + ph - (min(max(v, lo), hi) - lo) / (hi - lo) * ph
        parts.append(f'<text x="{ox + pw / 2}" y="{top - 10}" text-anchor="middle">{title}</text>')
        parts.append(f'<rect x="{ox}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        for e in range(x0, x1 + 1):
            x = sx(10 ** e)
            parts.append(f'<line x1="{x}" y1="{top}" x2="{x}" y2="{top + ph}" stroke="#eee"/>')
            parts.append(f'<text x="{x}" y="{top + ph + 14}" text-anchor="middle">1e{e}</text>')
        for k in range(5):
            v = lo + (hi - lo) * k / 4
            parts.append(f'<text x="{ox - 4}" y="{sy(v) + 4}" text-anchor="end">{v:.2f}</text>')
        if key in TARGETS:
            parts.append(f'<line x1="{ox}" y1="{sy(TARGETS[key])}" x2="{ox + pw}" y2="{sy(TARGETS[key])}" '
                         f'stroke="#2ca02c" stroke-dasharray="2,3"/>')
        for j, s in enumerate(data["series"]):
            c = colours[j % len(colours)]
            xy = " ".join(f"{sx(p['tokens']):.1f},{sy(p[key]):.1f}" for p in s["points"] if p["tokens"] > 0)
            parts.append(f'<polyline points="{xy}" fill="none" stroke="{c}" stroke-width="1.5"/>')
            parts += [f'<circle cx="{sx(p["tokens"]):.1f}" cy="{sy(p[key]):.1f}" r="2.5" fill="{c}"/>'
                      for p in s["points"] if p["tokens"] > 0]
        for j, series in enumerate(_by_heldout(data).values()):
            line = fit([p for s in series for p in s["points"]], key)
            if line:
                a, b = line
                t0, t1 = FIT_FROM, 10 ** x1
                parts.append(f'<line x1="{sx(t0):.1f}" y1="{sy(a + b * math.log(t0)):.1f}" x2="{sx(t1):.1f}" '
                             f'y2="{sy(a + b * math.log(t1)):.1f}" stroke="#555" stroke-dasharray="5,4"/>')
        parts.append(f'<text x="{ox + pw / 2}" y="{top + ph + 30}" text-anchor="middle">anchor tokens seen</text>')
    for j, s in enumerate(data["series"]):
        parts.append(f'<text x="{left}" y="{top + ph + 54 + 14 * j}" '
                     f'fill="{colours[j % len(colours)]}">{s["name"]} (held-out {s["heldout"]})</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="add (or replace) a run's evaluations, then draw")
    add.add_argument("run", type=Path)
    add.add_argument("--name", required=True)
    add.add_argument("--heldout", required=True, help="a name for the run's held-out set")
    add.add_argument("--cpu", default="", help="the machine the run trained on, as lscpu names it and its kind")
    sub.add_parser("draw", help="redraw the plot and the table")
    args = ap.parse_args(argv)
    data = json.loads(DATA.read_text()) if DATA.is_file() else {"series": []}
    if args.action == "add":
        points, provenance = run_points(args.run)
        data["series"] = [s for s in data["series"] if s["name"] != args.name]
        data["series"].append({"name": args.name, "heldout": args.heldout, "points": points, **provenance,
                               **({"cpu": args.cpu} if args.cpu else {})})
        DATA.write_text(json.dumps(data, indent=1) + "\n")
    SVG.write_text(svg(data))
    TABLE.write_text(table(data))
    print(TABLE.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
