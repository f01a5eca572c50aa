"""Tuning the tree search from numbers, with no model in the loop.

    python -m studies.tune_search record --out runs/dev --prompts 24     # greedy dart_pld traces of dev prompts
    python -m studies.tune_search replay runs/dev                        # every search setting, replayed

`record` decodes dev prompts (ShareGPT conversations from the end of the file: not the benchmark's MT-bench and
HumanEval prompts) with the default model and saves one trace each. `replay` rebuilds, for every recorded DART step,
the tree each search setting (n-gram weight, level exponent, logit decay, beam width, lookup-branch length) would
have built from the same draft rows, and counts what the target would have accepted: greedy decoding makes that
exact, since the target's continuation is the recorded output. The head's rows depend only on the committed tokens,
so a setting that would have landed on other positions sees rows like these; the steps are a sample of positions.
Each setting is scored as the automatic node budget scores budgets: the best expected tokens per second over node
budgets 1..60, E[tokens per step](b) / (draft and search time + t(1 + nodes(b))), with the machine's cost curve as
recorded in the traces.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from dart_core.budget.auto import MAX_BUDGET
from dart_core.budget.pool import CandidatePool, expected_rate
from dart_core.decoding import GenerationConfig, run
from dart_core.forensics.replay import replay_steps
from dart_core.machine.records import CostCurve
from dart_core.ngram import NGramModel
from dart_core.proposers import PromptLookupProposer
from dart_core.setup.chat import encode_prompt
from dart_core.setup.datasets import iter_sharegpt
from dart_core.setup.defaults import CPU_NODE_BUDGET, cache_root
from dart_core.setup.loading import DraftSettings, load
from dart_core.setup.ngram_tables import ensure_default_ngram
from dart_core.trace import Trace
from dart_core.tree_search import SearchConfig, search

GRID = {
    "ngram_weight": [0.0, 0.25, 0.5, 0.75, 1.0],
    "level_exponent": [0.4, 0.7, 1.0],
    "logit_decay": [0.8, 0.9, 1.0],
    "beam_width": [10, 20],
}
LOOKUP_TOKENS = [3, 5, 8, 10]


def dev_prompts(n: int) -> list[str]:
    """The first user turns of the last n usable ShareGPT conversations (short enough for a 2k context)."""
    firsts = [conv[0]["content"] for conv in iter_sharegpt()
              if conv[0]["role"] == "user" and 20 <= len(conv[0]["content"]) <= 2000]
    return firsts[-n:]


def record(out: Path, n: int, max_new_tokens: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    loaded = load("default")
    target = loaded.target
    # a fixed budget, so that every step drafts (the rows do not depend on the budget; the replay sizes the trees)
    settings = DraftSettings(SearchConfig(node_budget=CPU_NODE_BUDGET))
    proposer = loaded.proposer("dart_pld", settings)
    config = GenerationConfig(max_new_tokens=max_new_tokens, stop_ids=loaded.stop_ids)
    for i, text in enumerate(dev_prompts(n)):
        ids = encode_prompt(target.tokenizer, text)
        trace = loaded.new_trace("dart_pld", ids, text, config.sampling, max_new_tokens, settings)
        trace.steps = run(target, proposer, ids, config).steps
        trace.save(out / f"dev-{i:03d}.json.gz", top_candidates=0)   # the rows are what a replay needs
        print(f"{i + 1}/{n}: {len(trace.output_ids)} tokens, {len(trace.steps) - 1} steps", flush=True)


def _cost_curve(trace: Trace) -> CostCurve:
    """The trace's cost curve, else this machine's newest calibrated one (a fixed-budget run records none)."""
    if trace.settings.machine is not None and trace.settings.machine.cost_curve is not None:
        return trace.settings.machine.cost_curve
    files = sorted((cache_root() / "calibration").glob("cost-*.json"), key=lambda f: f.stat().st_mtime)
    if not files:
        sys.exit("no cost curve: run `python -m dart_core generate --prompt hi` once to calibrate this machine")
    print(f"cost curve from {files[-1]}", flush=True)
    return CostCurve.from_dict(json.loads(files[-1].read_text()))


def replay(folder: Path, top: int) -> None:
    traces = [Trace.load(p) for p in sorted(folder.glob("dev-*.json*"))]
    if not traces:
        sys.exit(f"no dev-*.json traces in {folder}")
    curve = _cost_curve(traces[0])
    table = NGramModel.load(ensure_default_ngram())
    eos = frozenset(traces[0].settings.stop_ids or [])
    # every DART step that drafted, with the target's continuation over its rows
    steps = [st for t in traces for st in replay_steps(t, ahead=0, whole=True)]
    overhead = float(np.mean([st.step.timings.get("draft", 0.0) + st.step.timings.get("search", 0.0)
                              for st in steps]))
    # the lookup branch depends on the context alone: look it up once per step and length
    branches = {n: [PromptLookupProposer(num_tokens=n).lookup(st.context) for st in steps] for n in LOOKUP_TOKENS}
    budgets = np.arange(MAX_BUDGET + 1)
    print(f"{len(traces)} traces, {len(steps)} DART steps; draft + search {overhead * 1e3:.1f} ms a step; "
          f"t(1) {curve.time(1) * 1e3:.1f} ms", flush=True)
    base = SearchConfig()
    results = []
    for values in itertools.product(*GRID.values()):
        config = replace(base, **dict(zip(GRID, values)))
        pools = [CandidatePool.of(search(np.asarray(st.step.rows_tokens), np.asarray(st.step.rows_probs), st.context,
                                replace(config, node_budget=MAX_BUDGET), table, eos).candidates) for st in steps]
        for n in [0] + LOOKUP_TOKENS:
            accepted, nodes = np.zeros(len(budgets)), np.zeros(len(budgets))
            for i, (st, pool) in enumerate(zip(steps, pools)):
                a, k = pool.accepted(branches[n][i] if n else [], st.future, budgets)
                accepted += a
                nodes += k
            tokens = 1 + accepted / len(pools)
            rate = expected_rate(tokens, nodes / len(pools), overhead, curve)
            b = 1 + int(np.argmax(rate[1:]))
            results.append((rate[b], tokens[b], b, n, dict(zip(GRID, values))))
    results.sort(key=lambda r: -r[0])
    plain = 1 / curve.time(1)
    default = next(r for r in results if r[4] == {k: getattr(base, k) for k in GRID} and r[3] == 5)
    for label, r in [("default (ngram 0.5, level 0.7, decay 0.9, beam 20, lookup 5)", default)] + \
            [(f"#{i + 1}", r) for i, r in enumerate(results[:top])]:
        print(f"{label}: {r[0]:.2f} tok/s ({r[0] / plain:.3f}x plain on the curve), {r[1]:.3f} tokens a step at "
              f"budget {r[2]}, lookup {r[3]}, {r[4]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.tune_search")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--prompts", type=int, default=24)
    r.add_argument("--max-new-tokens", type=int, default=128)
    s = sub.add_parser("replay")
    s.add_argument("folder", type=Path)
    s.add_argument("--top", type=int, default=10)
    args = p.parse_args(argv)
    if args.command == "record":
        record(args.out, args.prompts, args.max_new_tokens)
    else:
        replay(args.folder, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
