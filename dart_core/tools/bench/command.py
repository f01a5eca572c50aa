"""`python -m dart_core bench`: plan the benchmark, decode what is not done yet, and write the report (also when
interrupted: then whole prompts only, and the interrupt goes on to the command line, which exits 130)."""

from __future__ import annotations

import json
import platform
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import transformers

from .loop import Progress, decode_all, progress_bar
from .options import add_bench_args
from .plan import BenchPlan, plan_from_args
from .report import build_report, format_table
from .runs import complete_runs, key_of
from .runs_file import RunsFile, restore, runs_path
from .settings import resume_settings


def run_bench(args) -> dict:
    """Run the benchmark described by parsed CLI `args`; print the table, write the JSON, return the report."""
    plan = plan_from_args(args)
    threads = torch.get_num_threads()
    if plan.threads:
        torch.set_num_threads(plan.threads)
    try:
        return run_plan(plan)
    finally:
        torch.set_num_threads(threads)


def run_plan(plan: BenchPlan) -> dict:
    started = time.time()
    runs_file = RunsFile(runs_path(plan.out_path), resume_settings(plan), plan.resume)
    prompts, done = restore(runs_file, plan.prompts, plan.workload_info)
    progress = Progress(prompts, done, restored=set(done))
    try:
        with runs_file, progress_bar(plan, progress) as bar:
            decode_all(plan, progress, runs_file, bar)
    except KeyboardInterrupt:
        # Ctrl-C: every finished run is in the runs file; report the whole prompts among them, then stop as asked
        write_report(plan, progress, runs_file.path, started, interrupted=True)
        raise
    return write_report(plan, progress, runs_file.path, started, interrupted=False)


def write_report(plan: BenchPlan, progress: Progress, runs_file: Path, started: float, interrupted: bool) -> dict:
    """Build the report from the complete prompts' runs, print its table and write it to plan.out_path."""
    runs = complete_runs(progress.done, plan.dtypes, progress.prompts, plan.temperatures, plan.methods, plan.seed)
    report = build_report(runs, plan.methods, plan.dtypes, plan.temperatures, plan.workload_info)
    report["interrupted"] = interrupted
    report["runs_file"] = str(runs_file)
    report["resumed_runs"] = sum(key_of(r) in progress.restored for r in runs)     # taken from an earlier session
    report["settings"] = {
        "model": plan.model, "draft": plan.draft, "ngram": plan.ngram, "device": plan.device, "dtypes": plan.dtypes,
        "methods": plan.methods, "temperatures": plan.temperatures, "top_p": plan.top_p, "top_k": plan.top_k,
        "seed": plan.seed, "max_new_tokens": plan.max_new_tokens, "limit": plan.limit, "warmup": plan.warmup,
        "pld_tokens": plan.pld_tokens, "pld_ngram": plan.pld_ngram, "search": plan.search.to_dict(),
        "node_budget": "auto" if plan.auto_budget else plan.search.node_budget,
        "workloads": list(plan.workload_info), "prompts_file": plan.prompts_file,
        "candidates_recorded": plan.record_candidates,
    }
    report["environment"] = {
        **progress.environment, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(), "threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name() if plan.device.startswith("cuda") else None,
        "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "wall_seconds": round(time.time() - started, 1),     # this session's
    }
    print(format_table(report))
    Path(plan.out_path).write_text(json.dumps(report, indent=1))
    print(f"wrote {plan.out_path}" + (f" (partial: interrupted; --resume continues from {runs_file})"
                                      if interrupted else ""), file=sys.stderr)
    report["out"] = str(plan.out_path)
    return report


def cmd_bench(args) -> int:
    run_bench(args)
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark dart / pld / plain decoding against transformers generate",
                       description="Decode each prompt with every method (alternating per prompt), print a table "
                                   "and write a JSON report: tokens/s, speedup over transformers generate, tau, "
                                   "acceptance by depth, draft/search/verify time shares, and for greedy runs "
                                   "how many outputs are token-identical to plain decoding. Each finished "
                                   "run is also appended to OUT.runs.jsonl, so --resume can continue a "
                                   "benchmark that was stopped.",
                       conflict_handler="resolve")
    add_bench_args(p)
    p.set_defaults(handler=cmd_bench)
