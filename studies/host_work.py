"""The host's work in a DART step at a GPU's tree sizes, measured on a CPU: everything a step does besides the
target's and the draft head's forwards.

    python -m studies.host_work                          # budgets 8, 60, 128 and 255; 4 prompts, 48 new tokens each
    python -m studies.host_work --budgets 128 --prompts 2

On a GPU the forwards run on the device and the host does the rest: the tree search, the verify's tree mask, greedy
acceptance, the automatic budget's bookkeeping (and for `dart_pld` the prompt-lookup branch's lookup). This study
decodes with the default model at each fixed budget on this CPU, then replays those host parts over the recorded
steps, three rounds, the best kept: with the host's caches warm, as on a GPU's host. (Inside decoding on a CPU the
forward between two steps leaves them cold: the decode's own search and accept times, printed beside, are that upper
bound.) Prints ms a step per part.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from dart_core.acceptance import accept_choices
from dart_core.budget.auto import GPU_MAX_BUDGET, AutoBudget
from dart_core.budget.pool import CandidatePool
from dart_core.decoding import GenerationConfig, run
from dart_core.forensics.replay import replay_steps
from dart_core.lookup_index import LookupIndex
from dart_core.machine.records import CostCurve
from dart_core.proposers import PromptLookupProposer
from dart_core.setup.chat import encode_prompt
from dart_core.setup.datasets import humaneval_prompts, mtbench_prompts
from dart_core.setup.defaults import LOOKUP_LONGEST, PLD_NGRAM
from dart_core.setup.loading import load
from dart_core.tree_search import search
from studies.alternate import fixed

# a GPU's flat verify cost curve (what the automatic budget weighs there; its choice does not change the work timed)
GPU_CURVE = CostCurve((1, 16, 64, 256), (2.0e-3, 2.05e-3, 2.15e-3, 2.6e-3))
DART_PARTS = ("search", "tree mask", "accept", "budget")
# the search without its pruning record (DraftSettings.record_candidates off); dart_pld's lookup by the index decoding
# keeps, and by a scan of the context
PARTS = (*DART_PARTS, "lookup", "scan", "unrecorded")


@dataclasses.dataclass
class Step:
    rows_tokens: np.ndarray
    rows_probs: np.ndarray
    context: list[int]        # committed tokens and the root
    choices: list[int]        # the target's choice at each node (where the walk reads one; -1 elsewhere)
    tokens: list[int]         # the verified tree, as decoding built it
    parents: list[int]


def recorded_steps(trace) -> list[Step]:
    """Each drafting step of a trace with what its host parts read."""
    steps = []
    for replayed in replay_steps(trace):
        s = replayed.step
        if len(s.new_tokens) == len(s.path):   # not cut at a stop: the target's choice after each path node
            choices = [-1] * len(s.tree)
            for node, token in zip(s.path, s.new_tokens):
                choices[node] = token
            steps.append(Step(s.rows_tokens, s.rows_probs, replayed.context, choices, list(s.tree.tokens),
                              list(s.tree.parents)))
    return steps


def replay(steps: list[Step], proposer, budget: int) -> dict[str, float]:
    """Seconds a step of each host part, the steps replayed in order (the best of three rounds)."""
    config = proposer.search_config   # the study's fixed budget
    best = dict.fromkeys(PARTS, float("inf"))
    for _ in range(3):
        spent = dict.fromkeys(PARTS, 0.0)
        auto = AutoBudget(GPU_CURVE, start=budget, max_budget=GPU_MAX_BUDGET)
        lookup = LookupIndex(1, PLD_NGRAM, LOOKUP_LONGEST)
        scan = PromptLookupProposer(PLD_NGRAM, LOOKUP_LONGEST)
        for step in steps:
            t0 = time.perf_counter()
            result = search(step.rows_tokens, step.rows_probs, step.context, config, proposer.ngram, proposer.eos_ids)
            t1 = time.perf_counter()
            result.tree.ancestor_mask()
            t2 = time.perf_counter()
            accept_choices(result.tree, step.choices)
            t3 = time.perf_counter()
            auto.budget_for(step.context)
            auto.remember(step.context, CandidatePool.of_search(result), [], t1 - t0)
            t4 = time.perf_counter()
            lookup.lookup(step.context)   # what dart_pld's branch adds (10 tokens, n-grams up to 3)
            t5 = time.perf_counter()
            scan.lookup(step.context)
            t6 = time.perf_counter()
            if (result.tree.tokens, result.tree.parents) != (step.tokens, step.parents):
                raise AssertionError("the replayed search built another tree than decoding did")
            for part, seconds in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
                spent[part] += seconds
        t0 = time.perf_counter()
        for step in steps:   # a pass of its own: right after the same step's search its lookups would be cached
            search(step.rows_tokens, step.rows_probs, step.context, config, proposer.ngram, proposer.eos_ids,
                   record=False)
        spent["unrecorded"] = time.perf_counter() - t0
        best = {part: min(best[part], spent[part] / len(steps)) for part in PARTS}
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", default="8,60,128,255")
    ap.add_argument("--prompts", type=int, default=2, help="MT-bench and HumanEval prompts each")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    loaded = load(dtype="fp32")
    target = loaded.target
    print(target.hardware.describe())
    prompts = [encode_prompt(target.tokenizer, p.text)
               for p in mtbench_prompts()[:args.prompts] + humaneval_prompts()[:args.prompts]]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_ids=loaded.stop_ids)
    print("ms a step; replayed warm: dart's parts and their sum; the lookup dart_pld adds (by decoding's index, by a"
          " scan); the search without its pruning record; then decoding's own (cold) search and accept")
    columns = (*DART_PARTS, "sum", *PARTS[len(DART_PARTS):])
    print(f"{'budget':>6} {'rows':>6} " + " ".join(f"{p:>10}" for p in columns) + " | "
          + " ".join(f"{p:>10}" for p in ("search", "accept")))
    for budget in (int(b) for b in args.budgets.split(",")):
        proposer, _ = fixed(loaded, "dart", node_budget=budget)
        traces = [run(target, proposer, ids, config) for ids in prompts]
        steps = [s for trace in traces for s in recorded_steps(trace)]
        decoded = [s for trace in traces for s in trace.steps[1:] if s.rows_tokens is not None]
        parts = replay(steps, proposer, budget)
        rows = np.mean([len(s.tokens) for s in steps])
        cold = {k: np.mean([s.timings[k] for s in decoded]) * 1e3 for k in ("search", "accept")}
        warm = [parts[p] * 1e3 for p in DART_PARTS]
        more = [parts[p] * 1e3 for p in PARTS[len(DART_PARTS):]]
        print(f"{budget:6d} {rows:6.1f} " + " ".join(f"{t:10.3f}" for t in (*warm, sum(warm), *more)) + " | "
              + " ".join(f"{cold[p]:10.3f}" for p in ("search", "accept")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
