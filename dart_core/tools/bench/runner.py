"""Decoding one prompt with one method on a loaded target: ours through dart_core's loop (which fills a Metrics),
transformers' through `model.generate` (its forward passes counted with a hook). The clock runs around the whole
decode call, prefill included; where DART's automatic budget re-measures the machine's cost curve during the call (its
verifies disagreed with the curve: a busy machine), that calibration is taken out of the run's seconds and reported
apart, so a shared CPU's minute of measuring does not count as decoding."""

from __future__ import annotations

import time

import torch

from ...acceptance import SamplingConfig, is_greedy
from ...decoding import GenerationConfig, cut_at_stop, generate
from ...metrics import Metrics
from .methods import HF_PLD, is_hf
from .plan import BenchPlan
from .prompts import BenchPrompt
from .runs import Run


class Runner:
    """Decodes one prompt with one method on a loaded target, timing the whole call."""

    def __init__(self, target, proposers: dict, stops, plan: BenchPlan):
        self.target, self.proposers, self.stops, self.plan = target, proposers, frozenset(stops), plan
        self.cuda = target.device.type == "cuda"
        tok = target.tokenizer
        pad = getattr(tok, "pad_token_id", None) if tok is not None else None
        self.pad_id = pad if pad is not None else min(self.stops) if self.stops else 0

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()     # so the clock reads when the GPU is done, not when work was queued

    def run(self, method: str, prompt: BenchPrompt, temperature: float, seed: int, max_new: int) -> Run:
        if is_hf(method):
            return self._run_hf(method, prompt, temperature, seed, max_new)
        return self._run_ours(method, prompt, temperature, seed, max_new)

    def _run_ours(self, method, prompt, temperature, seed, max_new) -> Run:
        plan = self.plan
        sampling = SamplingConfig(temperature, plan.top_p, plan.top_k, seed)
        cfg = GenerationConfig(max_new, sampling, stop_ids=self.stops)
        proposer = self.proposers[method]
        metrics = Metrics()
        out: list[int] = []
        stop = None
        calibrated = _calibration_seconds(proposer)
        self._sync()
        t0 = time.perf_counter()
        for step in generate(self.target, proposer, prompt.ids, cfg):
            metrics.observe(step)
            out.extend(step.new_tokens)
            stop = step.stop_reason
        self._sync()
        seconds = time.perf_counter() - t0
        metrics.calibration_time = _calibration_seconds(proposer) - calibrated
        return Run(prompt, method, "", temperature, cut_at_stop(out, self.stops, max_new),
                   seconds - metrics.calibration_time, metrics=metrics, stop=stop,
                   calibration_seconds=metrics.calibration_time)

    def _run_hf(self, method, prompt, temperature, seed, max_new) -> Run:
        plan = self.plan
        model = self.target.model
        ids = torch.tensor([prompt.ids], dtype=torch.long, device=self.target.device)
        kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                      eos_token_id=sorted(self.stops), pad_token_id=self.pad_id)
        if is_greedy(temperature):
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=temperature, top_p=plan.top_p, top_k=plan.top_k)
            torch.manual_seed(seed)
        if method == HF_PLD:
            kwargs.update(prompt_lookup_num_tokens=plan.pld_tokens, max_matching_ngram_size=plan.pld_ngram)
        forwards = 0

        def count(module, inputs, output):
            nonlocal forwards
            forwards += 1

        handle = model.register_forward_hook(count)
        try:
            self._sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(**kwargs)
            self._sync()
            seconds = time.perf_counter() - t0
        finally:
            handle.remove()
        new = [int(t) for t in out[0, ids.shape[1]:].tolist()]
        cut = cut_at_stop(new, self.stops, max_new)
        stop = "stop_token" if cut and cut[-1] in self.stops else "max_new_tokens"
        return Run(prompt, method, "", temperature, cut, seconds, forwards=forwards, stop=stop)


def _calibration_seconds(proposer) -> float:
    """Seconds the proposer's automatic budget has spent re-measuring the cost curve so far (0 without one)."""
    budget = getattr(proposer, "auto_budget", None)
    return budget.calibration_seconds if budget is not None else 0.0
