"""The engine's speed on a GPU, every forward side by side: one benchmark per configuration (the forward, the dtype,
the node budget), then one table and one JSON report of them all.

    python -m scripts.gpu_speed --device cuda --out runs/gpu-speed            # what scripts/gpu-check.sh runs
    python -m scripts.gpu_speed --device cpu --prompts 1 --max-new-tokens 8 --model M --draft random --ngram none
    python -m scripts.gpu_speed --prompt-file prompts.jsonl   # carried prompts, where the data sets' packages are not
                                                              # (without it there: the project's EXAMPLES)

Configurations, most telling first (each is `python -m dart_core bench` with $DART_FORWARD set):
  lean          our forward, static cache, steps captured as CUDA graphs: hf_generate, vanilla, dart, dart_pld (fp32)
  lean 16 / 128 DART at a fixed node budget of 16 and of 128
  lean bf16     vanilla, dart, dart_pld in bf16
  lean, no pruning record   vanilla, dart, dart_pld without every candidate kept (bench --no-candidates)
  lean-eager    our forward without graphs
  transformers  transformers' forward (the engine before the lean forward): vanilla, dart, dart_pld
Per method: tokens/s, against transformers' `generate` and against our own plain lane (vanilla) of the same
configuration, tau, outputs identical to the configuration's plain reference, and each phase's milliseconds a step.
Configurations that would start after --seconds are skipped with a note, so the whole stays within a time limit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dart_core.errors import DartError
from dart_core.formats.jsonl import write_jsonl
from dart_core.setup.datasets import EXAMPLES, WORKLOADS, DatasetError
from dart_core.setup.loading import FORWARD_ENV
from dart_core.tools.bench import run_bench
from dart_core.tools.cli import build_parser

PHASES = ("draft", "search", "verify", "accept")


def missing_workloads(names: str) -> list[str]:
    """The workloads among `names` (comma-separated) whose data set is not installed here."""
    missing = []
    for name in names.split(","):
        try:
            WORKLOADS[name]()
        except (DatasetError, KeyError):
            missing.append(name)
    return missing


def examples_file(path: Path) -> Path:
    """The project's example prompts as a prompt file (bench --prompts)."""
    write_jsonl(path, ({"id": f"example/{i}", "prompt": text, "category": category}
                       for i, (category, text) in enumerate(EXAMPLES)))
    return path


@dataclass(frozen=True)
class Config:
    name: str
    forward: str
    methods: str
    dtype: str = "fp32"
    node_budget: str = "auto"
    record: bool = True          # DART's steps keep every candidate the search weighed (bench --no-candidates: off)


CONFIGS = (
    Config("lean", "lean", "hf_generate,vanilla,dart,dart_pld"),
    Config("lean 16 nodes", "lean", "vanilla,dart", node_budget="16"),
    Config("lean 128 nodes", "lean", "vanilla,dart", node_budget="128"),
    Config("lean bf16", "lean", "vanilla,dart,dart_pld", dtype="bf16"),
    Config("lean, no pruning record", "lean", "vanilla,dart,dart_pld", record=False),
    Config("lean-eager", "lean-eager", "vanilla,dart,dart_pld"),
    Config("transformers", "transformers", "vanilla,dart,dart_pld"),
)


def bench_argv(config: Config, args, out: Path) -> list[str]:
    return ["bench", "--model", args.model, "--draft", args.draft, "--ngram", args.ngram, "--device", args.device,
            "--methods", config.methods, "--dtype", config.dtype, "--node-budget", config.node_budget,
            *(["--prompts", args.prompt_file] if args.prompt_file else ["--workloads", args.workloads]),
            "--limit", str(args.prompts), "--max-new-tokens", str(args.max_new_tokens),
            "--temperature", "0", "--warmup", "1", "--no-progress", "--out", str(out),
            *([] if config.record else ["--no-candidates"])]


def rows_of(config: Config, report: dict) -> list[dict]:
    """One row a method (all workloads together), with milliseconds a step per phase."""
    results = [r for r in report["results"] if r["workload"] == "all"] or report["results"]
    plain = next((r["tokens_per_s"] for r in results if r["method"] == "vanilla"), None)
    rows = []
    for r in results:
        steps = (r["forward_passes"] or 0) - r["prompts"]
        phases = r.get("phase_time") or {}
        rows.append({"config": config.name, "method": r["method"], "dtype": r["dtype"],
                     "tokens_per_s": r["tokens_per_s"], "vs_generate": r["speedup"],
                     "vs_our_plain": round(r["tokens_per_s"] / plain, 3) if plain else None, "tau": r["tau"],
                     "identical": r["identical"], "compared": r["compared"],
                     "ms_per_step": {p: round(1e3 * phases[p] / steps, 3) for p in PHASES if p in phases and steps > 0}
                     or None})
    return rows


def format_rows(rows: list[dict]) -> str:
    head = f"{'config':16} {'method':12} {'tok/s':>8} {'vs gen':>7} {'vs ours':>7} {'tau':>5} {'same':>6}  " \
           f"ms/step draft/search/verify/accept"
    lines = [head]
    for r in rows:
        ms = r["ms_per_step"]
        phases = "/".join(f"{ms.get(p, 0):.2f}" for p in PHASES) if ms else "-"
        same = f"{r['identical']}/{r['compared']}" if r["compared"] else "-"
        lines.append(f"{r['config']:16} {r['method']:12} {r['tokens_per_s']:8.1f} {_x(r['vs_generate']):>7} "
                     f"{_x(r['vs_our_plain']):>7} {r['tau'] or 0:5.2f} {same:>6}  {phases}")
    return "\n".join(lines)


def _x(ratio) -> str:
    return f"{ratio:.2f}x" if ratio else "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.gpu_speed")
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="default")
    p.add_argument("--draft", default="default")
    p.add_argument("--ngram", default="default")
    p.add_argument("--workloads", default="mtbench,humaneval")
    p.add_argument("--prompts", type=int, default=4, help="prompts per workload")
    p.add_argument("--prompt-file", default=None,
                   help="a jsonl file with a 'prompt' field a line, instead of the workloads (where their data sets' "
                        "packages are not installed)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--only", default=None, help="comma list of configuration names (default: all)")
    p.add_argument("--seconds", type=float, default=420, help="no configuration starts after this many seconds")
    p.add_argument("--out", default="runs/gpu-speed", help="folder of the reports and the summary gpu-speed.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.prompt_file and (missing := missing_workloads(args.workloads)):
        args.prompt_file = str(examples_file(out / "examples.jsonl"))
        args.prompts = min(len(EXAMPLES), args.prompts * len(args.workloads.split(",")))
        print(f"NOTE  not installed here: {', '.join(missing)}; the table runs {args.prompts} of the project's "
              "example prompts instead (--prompt-file for others)", flush=True)
    chosen = [c for c in CONFIGS if args.only is None or c.name in args.only.split(",")]
    start, rows, skipped = time.perf_counter(), [], []
    asked = os.environ.get(FORWARD_ENV)
    try:
        for i, config in enumerate(chosen):
            if time.perf_counter() - start > args.seconds:
                skipped.append(config.name)
                continue
            os.environ[FORWARD_ENV] = config.forward
            print(f"INFO  {config.name}: {config.methods} ({config.dtype}, node budget {config.node_budget})",
                  flush=True)
            try:
                report = run_bench(build_parser().parse_args(bench_argv(config, args, out / f"bench-{i}.json")))
            except (DartError, RuntimeError) as exc:   # one configuration that cannot run does not end the others
                print(f"FAIL  {config.name}: {str(exc).splitlines()[0]}", flush=True)
                continue
            rows += rows_of(config, report)
    finally:   # the caller's forward as it was (the tests call this in one process)
        if asked is None:
            os.environ.pop(FORWARD_ENV, None)
        else:
            os.environ[FORWARD_ENV] = asked
    summary = {"device": args.device, "model": args.model, "prompts_per_workload": args.prompts,
               "workloads": args.workloads, "max_new_tokens": args.max_new_tokens, "rows": rows, "skipped": skipped,
               "seconds": round(time.perf_counter() - start, 1)}
    (out / "gpu-speed.json").write_text(json.dumps(summary, indent=1))
    print(format_rows(rows), flush=True)
    if skipped:
        print(f"NOTE  skipped (past {args.seconds:.0f} s): {', '.join(skipped)}", flush=True)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
