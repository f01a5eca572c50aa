"""A run (one prompt decoded by one method in one dtype and temperature), its key, and which runs make up whole
prompts, compared with their plain reference."""

from __future__ import annotations

from dataclasses import dataclass

from ...acceptance import is_greedy
from ...metrics import Metrics
from .methods import PLAIN
from .prompts import BenchPrompt, ident_tuple, prompt_ident


@dataclass
class Run:
    prompt: BenchPrompt
    method: str
    dtype: str
    temperature: float
    output: list[int]
    seconds: float                     # decoding: the whole call, less calibration_seconds
    forwards: int | None = None        # hf methods: target forward passes
    metrics: Metrics | None = None     # ours: the Metrics of this prompt
    stop: str | None = None
    first_diff: int | None = None      # greedy: first position differing from the reference (None: identical)
    reference: str | None = None
    seed: int | None = None
    calibration_seconds: float = 0.0   # the cost curve re-measured during the call (not decoding: reported apart)


def run_key(ident: dict, dtype: str, temperature: float, method: str, seed: int | None) -> tuple:
    # greedy decoding ignores the seed; a sampled run depends on it (it follows the prompt's place in the set)
    return (dtype, float(temperature), method, None if is_greedy(temperature) else seed, *ident_tuple(ident))


def key_of(run: Run) -> tuple:
    return run_key(prompt_ident(run.prompt), run.dtype, run.temperature, run.method, run.seed)


def planned_keys(dtype: str, prompts: list[BenchPrompt], temps, methods, seed: int) -> list[tuple]:
    return [run_key(prompt_ident(p), dtype, t, m, seed + i) for i, p in enumerate(prompts) for t in temps
            for m in methods]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """First position where two outputs differ (the shorter length if one is a prefix of the other), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def complete_runs(done: dict, dtypes, prompts, temps, methods, seed: int) -> list[Run]:
    """The runs of each prompt that every method finished, in run order, greedy ones compared with the plain
    reference among them. Old and new runs alike, so identity counts do not depend on where a session stopped."""
    runs = []
    for dtype in dtypes:
        for i, p in enumerate(prompts):
            ident = prompt_ident(p)
            for t in temps:
                group = {m: done.get(run_key(ident, dtype, t, m, seed + i)) for m in methods}
                if None in group.values():
                    continue          # cut short mid-prompt: its finished runs wait in the runs file
                if is_greedy(t):
                    compare_to_reference(group)
                runs.extend(group.values())
    return runs


def compare_to_reference(group: dict[str, Run]) -> None:
    ref = next((r for r in PLAIN if r in group), None)
    if ref is None:
        return
    for run in group.values():
        run.reference, run.first_diff = ref, first_difference(run.output, group[ref].output)
