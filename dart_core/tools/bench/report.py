"""The report: runs summed per (method, dtype, temperature, workload), and its printed table.

Definitions (per method, dtype, temperature and workload, summed over its prompts):
  tokens_per_s  new tokens / decode wall time. The clock runs around the whole decode call of each prompt (prefill
                included, prompt tokenization excluded), the same for every method.
  calibration_seconds  DART with --node-budget auto: time its automatic budget spent re-measuring the machine's
                verify cost curve mid-run (the run's verifies disagreed with the curve), taken out of the decode
                wall time above and reported here apart.
  speedup       tokens_per_s / tokens_per_s of hf_generate in the same dtype (and temperature, workload).
                speedup_vs_hf_fp32 divides by hf_generate in fp32, speedup_vs_hf_best by hf_generate in its faster
                dtype.
  tau           ours: tokens emitted per verify step (dart_core.metrics). hf_*: new tokens / target forward passes
                (counted with a forward hook on the model), so plain decoding gives 1.0 for both.
  tokens_per_forward  new tokens / target forward passes, the prefill included, for every method alike (the
                apples-to-apples figure between hf_pld and pld; hf_pld may already accept drafts in its prefill).
  phase_share   ours: each of draft/search/verify/accept's share of their summed time, prefill excluded
                (Metrics.phase_share); None for hf_*.
  node_budgets  DART: verify steps per node budget used (with --node-budget auto, the budgets the run chose; the
                machine's cost curve and kernels are in environment.machine)
  identical     greedy only: outputs token-identical to the reference plain decoding in the same dtype (hf_generate
                when it runs, else vanilla); every divergence is listed with its first differing position.
Outputs are cut after the first stop token for every method before they are counted or compared.
Ours take their figures from dart_core.metrics.Metrics; this module only sums and presents them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...metrics import Metrics, tokens_per_second
from .methods import HF_GENERATE, PLAIN, is_hf
from .prompts import ALL
from .runs import Run, first_difference

BENCH_FORMAT = "dart-lab-bench/1"


def hf_per_forward(tokens: int, forwards: int | None) -> float | None:
    """tau and tokens per forward of transformers' methods alike: new tokens / hook-counted forward passes (they
    have no verify steps to tell from the prefill). None when no forward was counted."""
    return tokens / forwards if forwards else None


@dataclass
class Cell:
    """The totals of one (method, dtype, temperature, workload)."""
    method: str
    dtype: str
    temperature: float
    workload: str
    prompts: int = 0
    tokens: int = 0
    seconds: float = 0.0
    calibration_seconds: float = 0.0   # left out of seconds (see the module doc)
    forwards: int = 0                  # hf methods: hook-counted forward passes
    metrics: Metrics | None = None     # ours: the prompts' Metrics merged
    compared: int = 0
    identical: int = 0
    identical_vs: dict = field(default_factory=dict)  # plain method -> [identical, compared]
    reference: str | None = None
    divergences: list = field(default_factory=list)

    def add(self, run: Run, cmp_all: dict[str, int | None]) -> None:
        self.prompts += 1
        self.tokens += len(run.output)
        self.seconds += run.seconds
        self.calibration_seconds += run.calibration_seconds
        self.forwards += run.forwards or 0
        if run.metrics is not None:
            if self.metrics is None:
                self.metrics = Metrics()
            self.metrics.merge(run.metrics)
        if run.reference is not None:
            self.reference = run.reference
            self.compared += 1
            if run.first_diff is None:
                self.identical += 1
            else:
                self.divergences.append({"prompt": run.prompt.id, "position": run.first_diff,
                                         "reference": run.reference})
        for ref, diff in cmp_all.items():
            entry = self.identical_vs.setdefault(ref, [0, 0])
            entry[1] += 1
            entry[0] += diff is None

    @property
    def tokens_per_s(self) -> float:
        return tokens_per_second(self.tokens, self.seconds)

    def tau(self) -> float | None:
        if is_hf(self.method):
            return hf_per_forward(self.tokens, self.forwards)
        return self.metrics.tau if self.metrics is not None else None

    def forward_passes(self) -> int | None:
        if is_hf(self.method):
            return self.forwards
        return self.metrics.forward_passes if self.metrics is not None else None

    def tokens_per_forward(self) -> float | None:
        if is_hf(self.method):
            return hf_per_forward(self.tokens, self.forwards)
        m = self.metrics
        return m.tokens_per_forward if m is not None and m.forward_passes else None

    def to_dict(self) -> dict:
        m = self.metrics
        greedy = self.reference is not None
        return {
            "method": self.method, "dtype": self.dtype, "temperature": self.temperature, "workload": self.workload,
            "prompts": self.prompts, "new_tokens": self.tokens, "seconds": round(self.seconds, 4),
            "calibration_seconds": round(self.calibration_seconds, 4),
            "tokens_per_s": round(self.tokens_per_s, 3), "speedup": None, "speedup_vs_hf_fp32": None,
            "speedup_vs_hf_best": None,
            "tau": _round(self.tau()),
            "forward_passes": self.forward_passes(),
            "tokens_per_forward": _round(self.tokens_per_forward()),
            "acceptance_by_depth": None if m is None else [round(x, 4) for x in m.acceptance_by_depth],
            "accepted_hist": None if m is None else list(m.accepted_hist),
            "node_budgets": None if m is None or not m.node_budgets else dict(m.node_budgets),
            "phase_share": None if m is None else {p: round(s, 4) for p, s in m.phase_share.items()},
            "phase_time": None if m is None else {k: round(v, 4) for k, v in m.phase_time.items()},
            "identical": self.identical if greedy else None,
            "compared": self.compared if greedy else None,
            "reference": self.reference,
            "identical_vs": {k: {"identical": v[0], "compared": v[1]} for k, v in self.identical_vs.items()}
            if greedy else None,
            "divergences": self.divergences if greedy else None,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def build_report(runs: list[Run], methods, dtypes, temps, workload_info) -> dict:
    """The report's results (one row a cell, with its speedups) and runs; the caller adds settings and such."""
    cells = _cells(runs)
    results = []
    workloads = [ALL] + [w for w in workload_info if any(r.prompt.workload == w for r in runs)]
    for t in temps:
        for w in workloads:
            hf = {d: cells.get((HF_GENERATE, d, t, w)) for d in dtypes}
            hf_speed = {d: c.tokens_per_s for d, c in hf.items() if c is not None and c.tokens_per_s > 0}
            best = max(hf_speed.values()) if hf_speed else None
            for m in methods:
                for d in dtypes:
                    c = cells.get((m, d, t, w))
                    if c is None:
                        continue
                    r = c.to_dict()
                    if d in hf_speed:
                        r["speedup"] = round(c.tokens_per_s / hf_speed[d], 4)
                    if "fp32" in hf_speed:
                        r["speedup_vs_hf_fp32"] = round(c.tokens_per_s / hf_speed["fp32"], 4)
                    if best:
                        r["speedup_vs_hf_best"] = round(c.tokens_per_s / best, 4)
                    results.append(r)
    return {"format": BENCH_FORMAT, "workloads": workload_info, "results": results,
            "runs": [_run_row(r) for r in runs]}


def _cells(runs: list[Run]) -> dict[tuple, Cell]:
    """Each run summed into its workload's cell and the ALL cell, greedy ones compared with each plain method."""
    cells: dict[tuple, Cell] = {}
    groups: dict[tuple, dict[str, Run]] = {}
    for run in runs:
        groups.setdefault((id(run.prompt), run.dtype, run.temperature), {})[run.method] = run
    for run in runs:
        cmp_all = {}
        if run.reference is not None:
            siblings = groups[(id(run.prompt), run.dtype, run.temperature)]
            cmp_all = {ref: first_difference(run.output, siblings[ref].output)
                       for ref in PLAIN if ref in siblings and ref != run.method}
        for w in (run.prompt.workload, ALL):
            key = (run.method, run.dtype, run.temperature, w)
            if key not in cells:
                cells[key] = Cell(run.method, run.dtype, run.temperature, w)
            cells[key].add(run, cmp_all)
    return cells


def _run_row(r: Run) -> dict:
    if is_hf(r.method):
        forwards, tau = r.forwards, hf_per_forward(len(r.output), r.forwards)
    else:
        forwards = r.metrics.forward_passes if r.metrics is not None else None
        tau = r.metrics.tau
    return {"prompt": r.prompt.id, "workload": r.prompt.workload, "method": r.method, "dtype": r.dtype,
            "temperature": r.temperature, "prompt_tokens": len(r.prompt.ids), "new_tokens": len(r.output),
            "seconds": round(r.seconds, 5), "calibration_seconds": round(r.calibration_seconds, 5),
            "forwards": forwards, "tau": _round(tau),
            "stop": r.stop, "first_diff": r.first_diff, "reference": r.reference}


def format_table(report: dict) -> str:
    rows = [("workload", "temp", "method", "dtype", "n", "tok/s", "speedup", "vs hf32", "tau", "acc@1/2/3",
             "draft/search/verify %", "identical")]
    for r in report["results"]:
        acc = r["acceptance_by_depth"]
        acc_s = "/".join(f"{x:.2f}" for x in (acc or [])[:3]) if acc else "-"
        sh = r["phase_share"]
        sh_s = "/".join(f"{100 * sh[p]:.0f}" for p in ("draft", "search", "verify")) if sh else "-"
        if r["identical"] is None:
            ident = "-"
        elif r["reference"] == r["method"]:
            ident = "ref"
        else:
            ident = f"{r['identical']}/{r['compared']}"
        rows.append((r["workload"], f"{r['temperature']:g}", r["method"], r["dtype"], str(r["prompts"]),
                     f"{r['tokens_per_s']:.1f}", _x(r["speedup"]), _x(r["speedup_vs_hf_fp32"]),
                     "-" if r["tau"] is None else f"{r['tau']:.2f}", acc_s, sh_s, ident))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    calibrated = [r for r in report["results"] if r["workload"] == ALL and r.get("calibration_seconds")]
    lines += [f"{r['method']} {r['dtype']} t={r['temperature']:g}: the cost curve re-measured mid-run for "
              f"{r['calibration_seconds']:.1f} s (not counted in tok/s)" for r in calibrated]
    return "\n".join(lines)


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"
