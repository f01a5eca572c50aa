"""The plan of one benchmark: every setting it runs with, checked and resolved once from the parsed command line
(prompts loaded, the output path checked, the default n-gram table found) before any model loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ...methods import uses_head
from ...setup.files import check_writable
from ...setup.loading import DraftSettings, fast_dtype
from ...setup.ngram_tables import ensure_default_ngram
from ...tree_search import SearchConfig
from ..args import CliError, auto_budget_from, search_config_from
from .options import check_numbers, parse_dtypes, parse_methods, parse_temperatures, split_list
from .prompts import BenchPrompt, load_prompts

DEFAULT_WORKLOADS = ["mtbench", "humaneval"]


@dataclass
class BenchPlan:
    methods: list[str]
    dtypes: list[str]
    temperatures: list[float]
    prompts: list[BenchPrompt]
    workload_info: dict                  # per workload: prompts, skipped (and why), its file
    out_path: Path
    model: str
    draft: str
    ngram: str                           # resolved: the default table's file when a DART method runs
    device: str
    search: SearchConfig
    auto_budget: bool                    # DART's node budget chosen as the run goes (search.node_budget: the start)
    recalibrate: bool                    # measure the machine's kernels and cost curve again
    draft_kernels: str                   # auto / native / int8 / fp32: how DART's head drafts
    thinking: bool                       # the chat template's reasoning block (Qwen3) is on
    max_new_tokens: int
    top_p: float
    top_k: int
    seed: int
    pld_tokens: int
    pld_ngram: int
    lookup_tokens: int | None
    ngram_context_weight: float
    warmup: int
    limit: int | None
    prompts_file: str | None
    threads: int | None
    resume: bool
    progress: bool
    record_candidates: bool = True       # DART's steps keep every candidate the search weighed (--no-candidates: off)
    loaded_targets: dict = field(default_factory=dict, repr=False)   # dtype -> a target loaded already (--dtype auto)

    def draft_settings(self) -> DraftSettings:
        return DraftSettings(self.search, self.auto_budget, lookup_tokens=self.lookup_tokens,
                             context_weight=self.ngram_context_weight, pld_tokens=self.pld_tokens,
                             pld_ngram=self.pld_ngram, record_candidates=self.record_candidates)


def plan_from_args(args) -> BenchPlan:
    methods = parse_methods(args.methods)
    dtypes = None if args.dtype == "auto" else parse_dtypes(args.dtype)   # auto loads the model: after the checks
    temps = parse_temperatures(args.temperature)
    check_numbers(args)
    search = search_config_from(args)
    out_path = check_writable(args.out or default_out_path())
    if args.workloads is not None:
        workloads = split_list(args.workloads)
    else:
        workloads = [] if args.prompts else DEFAULT_WORKLOADS
    prompts, workload_info = load_prompts(workloads, args.prompts, args.limit)
    if not prompts:
        raise CliError("no prompts to run (check --workloads / --prompts)")
    targets = {}      # --dtype auto measures on the fp32 target: the fp32 runs decode with it
    if dtypes is None:
        def fast():
            choice, targets["fp32"] = fast_dtype(args.model, args.device, args.recalibrate)
            return choice
        dtypes = parse_dtypes("auto", fast)
    progress = not args.no_progress
    ngram = args.ngram
    if ngram == "default" and any(uses_head(m) for m in methods):     # only DART reads the table
        ngram = str(ensure_default_ngram(progress=progress))
    return BenchPlan(
        methods=methods, dtypes=dtypes, temperatures=temps, prompts=prompts, workload_info=workload_info,
        out_path=out_path, model=args.model, draft=args.draft, ngram=ngram, device=args.device, search=search,
        auto_budget=auto_budget_from(args), recalibrate=args.recalibrate, draft_kernels=args.draft_kernels,
        thinking=args.thinking, max_new_tokens=args.max_new_tokens, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        pld_tokens=args.pld_tokens, pld_ngram=args.pld_ngram, lookup_tokens=getattr(args, "lookup_tokens", None),
        ngram_context_weight=args.ngram_context_weight, warmup=args.warmup, limit=args.limit,
        prompts_file=args.prompts, threads=args.threads, resume=args.resume, progress=progress,
        record_candidates=not args.no_candidates,
        loaded_targets={d: t for d, t in targets.items() if t is not None})


def default_out_path() -> str:
    return str(Path("runs") / f"bench-{datetime.now():%Y%m%d-%H%M%S}.json")
