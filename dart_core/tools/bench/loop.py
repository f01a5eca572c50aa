"""Decoding every planned run not yet done, a dtype at a time (the target loads once per dtype).

Every method decodes every prompt, methods alternating per prompt (the order rotates from prompt to prompt) so that
drift in machine speed falls on all of them alike. Each finished run goes to the runs file at once.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from ...setup.chat import encode_prompt
from ...methods import uses_head
from ...setup.calibration import machine_record
from ...setup.loading import load, load_target
from .methods import is_hf
from .plan import BenchPlan
from .prompts import BenchPrompt, prompt_ident, skip_prompt
from .runner import Runner
from .runs import Run, planned_keys, run_key
from .runs_file import RunsFile

WARMUP_TOKENS = 16                        # the untimed warm-up decodes are short


@dataclass
class Progress:
    """How far the benchmark got: what the report is built from, whether it finished or was interrupted."""
    prompts: list[BenchPrompt]            # this session's prompts, less those skipped
    done: dict[tuple, Run]                # every finished run by run_key, restored ones included
    restored: set[tuple]                  # the keys of runs taken from an earlier session
    environment: dict = field(default_factory=dict)   # the target's shape, once one is loaded


def progress_bar(plan: BenchPlan, progress: Progress) -> tqdm:
    total = len(plan.dtypes) * len(progress.prompts) * len(plan.temperatures) * len(plan.methods)
    already = sum(k in progress.restored for d in plan.dtypes for k in _planned(plan, d, progress.prompts))
    return tqdm(total=total, initial=already, unit="run", desc="bench", disable=not plan.progress, file=sys.stderr,
                dynamic_ncols=True)


def decode_all(plan: BenchPlan, progress: Progress, runs_file: RunsFile, bar: tqdm) -> None:
    for dtype in plan.dtypes:
        if all(k in progress.done for k in _planned(plan, dtype, progress.prompts)):
            plan.loaded_targets.pop(dtype, None)
            continue          # every run of this dtype is in the runs file: do not even load it
        decode_dtype(plan, dtype, progress, runs_file, bar)
        gc.collect()          # the dtype's target is unreferenced now: free it before the next one loads
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def decode_dtype(plan: BenchPlan, dtype: str, progress: Progress, runs_file: RunsFile, bar: tqdm) -> None:
    """Load the target in `dtype`, drop the prompts too long for it, warm up, then decode the runs not yet done."""
    bar.set_description(f"bench {dtype}: loading")
    target = plan.loaded_targets.pop(dtype, None) or load_target(plan.model, plan.device, dtype, plan.recalibrate)
    heads = any(uses_head(m) for m in plan.methods)
    loaded = load(plan.model, plan.draft, plan.ngram, plan.device, dtype, heads, plan.recalibrate, plan.draft_kernels,
                  target=target)
    stops = loaded.stop_ids
    settings = plan.draft_settings()   # each DART method gets its own automatic budget: it learns its own acceptance
    proposers = {m: loaded.proposer(m, settings) for m in plan.methods if not is_hf(m)}
    # with how DART drafted here (the choice is measured once per machine and cached)
    machine = machine_record(target, plan.model, plan.auto_budget, loaded.draft_choice)
    progress.environment.setdefault("machine", {})[dtype] = machine.to_dict()
    progress.prompts = fitting_prompts(plan, target, progress.prompts, runs_file)
    progress.environment.setdefault("target", {"vocab_size": target.vocab_size, "layers": target.num_layers,
                                               "hidden_size": target.hidden_size, "stop_ids": sorted(stops)})
    runner = Runner(target, proposers, stops, plan)
    bar.set_description(f"bench {dtype}: warm-up")
    for p in progress.prompts[: plan.warmup]:
        for m in plan.methods:
            runner.run(m, p, 0.0, plan.seed, min(WARMUP_TOKENS, plan.max_new_tokens))
    bar.set_description(f"bench {dtype}")
    for i, p in enumerate(progress.prompts):
        ident = prompt_ident(p)
        seed = plan.seed + i
        shift = i % len(plan.methods)
        order = plan.methods[shift:] + plan.methods[:shift]      # rotate: cancel drift
        for temperature in plan.temperatures:
            for m in order:
                key = run_key(ident, dtype, temperature, m, seed)
                if key in progress.done:
                    continue
                bar.set_postfix_str(f"{m} {p.id}", refresh=False)
                run = runner.run(m, p, temperature, seed, plan.max_new_tokens)
                run.dtype, run.seed = dtype, seed
                runs_file.add_run(run)
                progress.done[key] = run
                bar.update(1)


def fitting_prompts(plan: BenchPlan, target, prompts: list[BenchPrompt], runs_file: RunsFile) -> list[BenchPrompt]:
    """`prompts` tokenized, less those whose tokens and max new tokens exceed the target's context (skipped)."""
    keep = []
    for p in prompts:
        if not p.ids:
            p.ids = encode_prompt(target.tokenizer, p.text, raw=p.raw, thinking=plan.thinking)
        if len(p.ids) + plan.max_new_tokens > target.max_positions:
            reason = (f"{p.id}: prompt of {len(p.ids)} tokens + max new tokens exceeds the context of "
                      f"{target.max_positions}")
            skip_prompt(plan.workload_info, p, reason)
            runs_file.add_skip(p, reason)    # so that a resumed run skips it without loading the model
            continue
        keep.append(p)
    return keep


def _planned(plan: BenchPlan, dtype: str, prompts: list[BenchPrompt]) -> list[tuple]:
    return planned_keys(dtype, prompts, plan.temperatures, plan.methods, plan.seed)
