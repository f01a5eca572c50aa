"""Other ways to size and choose a DART step's tree, replayed over recorded steps: is there τ or speed the search's
own ranking at one budget leaves?

    python -m studies.tree_policies                      # 14 + 14 prompts after the 20-prompt check's, 128 tokens
    python -m studies.tree_policies --prompts 6

Decodes MT-bench and HumanEval prompts the benchmark check does not use (from the 11th of each) with `dart`, then
reads every step's candidate pool with what the target said after its root (exact for greedy decoding; as the
automatic budget does, dart_core.budget.pool) under each policy:
- a fixed budget b: the search's top b (what the engine does, b chosen per run);
- a budget per step from the draft's path probabilities (the product of draft probabilities from the root): the
  search's ranking cut at the first candidate below p, or at as many candidates as reach p;
- the top b by path probability instead of the search's score.
Each policy's expected tokens/s: tokens over (the run's mean drafting and search time + t(1 + nodes)) a step, t from
this machine's verify cost curve. Prints τ, mean nodes and tokens/s per policy.
"""

from __future__ import annotations

import argparse

import numpy as np

from dart_core.decoding import GenerationConfig, run
from dart_core.forensics.replay import replay_steps
from dart_core.setup.chat import encode_prompt
from dart_core.setup.datasets import humaneval_prompts, mtbench_prompts
from dart_core.setup.defaults import default_search_config
from dart_core.setup.loading import DraftSettings, load

FIRST = 10          # the 20-prompt check uses the first 10 of each set
POOL_TOP = 64       # candidates a per-step budget may reach


def ranks_by(key: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Each candidate's rank when ordered by `key` (descending), shallower first on ties."""
    order = np.lexsort((level, -key))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def path_probability(draft_prob: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """The product of draft probabilities from the root to each candidate (parents come before children)."""
    p = draft_prob.astype(np.float64)
    for i in range(len(p)):
        if parent[i] >= 0:
            p[i] *= p[parent[i]]
    return p


def accepted_ranks(c, future: list[int], rank: np.ndarray) -> list[int]:
    """The ranks of the candidates spelling the target's path from the root, as far as the pool holds it."""
    out, prev = [], -1
    for token in future:
        hit = np.flatnonzero((c.parent == prev) & (c.token == token))
        if not hit.size:
            break
        prev = int(hit[0])
        out.append(int(rank[prev]))
    return out


def accepted(path_ranks: list[int], budget: int) -> int:
    """Tokens a tree of the top `budget` accepts: the path's candidates up to the first ranked at or past it."""
    n = 0
    while n < len(path_ranks) and path_ranks[n] < budget:
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=14, help="prompts of each set (after the check's first 10)")
    args = ap.parse_args(argv)
    loaded = load(dtype="fp32")
    target = loaded.target
    prompts = mtbench_prompts()[FIRST: FIRST + args.prompts] + humaneval_prompts()[FIRST: FIRST + args.prompts]
    proposer = loaded.proposer("dart", DraftSettings(default_search_config(), True))
    curve = proposer.auto_budget.curve
    config = GenerationConfig(max_new_tokens=128, stop_ids=loaded.stop_ids)
    steps, host = [], []
    for p in prompts:
        trace = run(target, proposer, encode_prompt(target.tokenizer, p.text), config)
        for st in replay_steps(trace):
            c = st.step.candidates
            score_rank = ranks_by(c.score, c.level)
            p_path = path_probability(c.draft_prob, c.parent)
            steps.append((accepted_ranks(c, st.future, score_rank), p_path[np.argsort(score_rank)][:POOL_TOP],
                          accepted_ranks(c, st.future, ranks_by(p_path, c.level))))
            host.append(st.step.timings.get("draft", 0.0) + st.step.timings.get("search", 0.0))
    overhead = float(np.mean(host))
    print(f"{target.hardware.describe()}; {len(steps)} steps of {len(prompts)} prompts, drafting and search "
          f"{overhead * 1e3:.2f} ms a step")

    def report(name: str, budgets: list[int], by_probability: bool = False):
        tokens = [1 + accepted(s[2] if by_probability else s[0], b) for s, b in zip(steps, budgets)]
        seconds = sum(overhead + curve.time(1 + b) for b in budgets)
        print(f"{name:36s} τ {np.mean(tokens):.3f}  nodes {np.mean(budgets):5.1f}  {sum(tokens) / seconds:7.1f} tokens/s")

    for b in (4, 6, 7, 8, 10, 12, 16):
        report(f"the search's top {b}", [b] * len(steps))
    for p in (0.02, 0.03, 0.05, 0.08, 0.12):
        report(f"the search's ranking, cut below p {p}",
               [max(1, int(np.argmin(s[1] >= p)) if not (s[1] >= p).all() else len(s[1])) for s in steps])
        report(f"as many as reach p {p}", [max(1, int((s[1] >= p).sum())) for s in steps])
    for b in (4, 6, 7, 8, 10):
        report(f"the top {b} by path probability", [b] * len(steps), by_probability=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
