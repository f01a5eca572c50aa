"""Sampling statistics for the lossless tests: the exact distribution of a few sampled tokens, a chi-square of
sampled outputs against it, and sampled decodes through the whole loop."""

import random
from collections import Counter
from dataclasses import replace

import torch
from scipy.stats import chisquare

from dart_core.acceptance import SamplingConfig, processed_probs
from dart_core.decoding import GenerationConfig, run
from dart_core.target import TargetModel


def exact_joint(target: TargetModel, prompt: list[int], sampling: SamplingConfig, n_tokens: int) -> dict:
    """{sequence of n_tokens: probability} under the target's processed distribution, every sequence enumerated."""
    joint = {(): 1.0}
    with torch.inference_mode():
        for _ in range(n_tokens):
            prefixes = list(joint)
            logits = target.model(input_ids=torch.tensor([prompt + list(k) for k in prefixes])).logits[:, -1]
            probs = processed_probs(logits, sampling).double()
            joint = {k + (t,): joint[k] * float(p[t])
                     for k, p in zip(prefixes, probs) for t in torch.nonzero(p).flatten().tolist()}
    return joint


def chi2_pvalue(outputs: list[tuple], joint: dict, min_expected: float = 5.0) -> float:
    """Pearson chi-square of sampled sequences against `joint`: one cell per sequence expected at least
    `min_expected` times, one cell for all the others."""
    n, counts = len(outputs), Counter(outputs)
    cells = [k for k in joint if joint[k] * n >= min_expected]
    observed = [counts[k] for k in cells]
    expected = [joint[k] * n for k in cells]
    return float(chisquare(observed + [n - sum(observed)], expected + [n - sum(expected)]).pvalue)


def sample_through_the_loop(target, proposer, prompt, sampling: SamplingConfig, n_tokens: int, n_runs: int) -> dict:
    """n_runs sampled decodes with fixed seeds: their outputs, and what the verify steps did."""
    seeds = random.Random(0)
    stats = {"outputs": [], "verify_steps": [], "accepted": 0, "compacted_then_verified": 0}
    for _ in range(n_runs):
        cfg = GenerationConfig(max_new_tokens=n_tokens, sampling=replace(sampling, seed=seeds.randrange(2**31)))
        trace = run(target, proposer, prompt, cfg)
        steps = [s for s in trace.steps if s.kind == "verify"]
        stats["outputs"].append(tuple(trace.output_ids))
        stats["verify_steps"].append(len(steps))
        stats["accepted"] += sum(s.accepted for s in steps)
        # an accepted path that is not a prefix of the node order makes commit compact the cache (index_select,
        # not a crop); a verify step after it scores its tree on the compacted cache
        compacted = [s.path != list(range(len(s.path))) for s in steps]
        stats["compacted_then_verified"] += any(compacted[:-1])
    return stats
