"""The decoding loop shared by every method: propose a tree, verify it in one target forward, accept, commit.

The target cache always holds the committed tokens; the token the target chose last (the "root") is pending and
is verified as the root of the next tree. The loop is a generator that yields one StepRecord per target forward.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .acceptance import SamplingConfig, accept, accept_choices, choose_token
from .errors import ConfigError
from .fixed_step import FIXED_BUCKETS
from .proposers import Proposer
from .target import TargetModel
from .machine.timing import PhaseClock
from .trace import RunSettings, StepRecord, Trace


TREE_ROOM = FIXED_BUCKETS[-1]   # cache entries beyond the run's tokens, for a verified tree padded to its bucket


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_ids: frozenset[int] = frozenset()
    max_context: int | None = None   # prompt + generated tokens; defaults to the model's max positions

    def validate(self) -> "GenerationConfig":
        if self.max_new_tokens <= 0:
            raise ConfigError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if self.max_context is not None and self.max_context < 2:
            raise ConfigError(f"max_context must be >= 2, got {self.max_context}")
        self.sampling.validate()
        return self


def generate(target: TargetModel, proposer: Proposer, prompt_ids: list[int],
             config: GenerationConfig) -> Iterator[StepRecord]:
    """Decode from `prompt_ids`, yielding the prefill record and then one record per verify step."""
    config.validate()
    if not prompt_ids:
        raise ConfigError("the prompt is empty")
    max_context = min(config.max_context or target.max_positions, target.max_positions)
    if len(prompt_ids) >= max_context:
        raise ConfigError(f"the prompt has {len(prompt_ids)} tokens; the context limit is {max_context}")
    proposer.reset()
    cache = target.new_cache(len(prompt_ids) + config.max_new_tokens + TREE_ROOM)
    try:
        yield from _decode(target, proposer, prompt_ids, config, cache, max_context)
    finally:   # also when the caller stops early: a static cache goes back for the next decode
        target.release(cache)


def _decode(target: TargetModel, proposer: Proposer, prompt_ids: list[int], config: GenerationConfig, cache,
            max_context: int) -> Iterator[StepRecord]:
    greedy = config.sampling.greedy
    gen = None if greedy else config.sampling.make_generator()
    stops = frozenset(config.stop_ids)
    clock = PhaseClock(target.device)
    start = time.perf_counter()
    clock.mark()
    logits, features = target.prefill(list(prompt_ids), cache, features=proposer.needs_features)
    root = choose_token(logits, config.sampling, gen)
    clock.mark()
    committed = list(prompt_ids)
    emitted = 1
    step = StepRecord(index=0, kind="prefill", context_len=0, new_tokens=[root],
                      timings={"prefill": clock.spans()[0]})
    step.stop_reason = _stop_reason([root], stops, emitted, config.max_new_tokens, len(committed) + 1, max_context)
    step.elapsed = time.perf_counter() - start
    yield step

    index = 1
    while step.stop_reason is None:
        past = len(committed)
        # After this step the sequence holds past + len(path) + 1 (bonus) tokens: keep that within the context.
        max_nodes = max_context - past - 2
        clock.mark()
        proposal = proposer.propose(committed + [root], features, max_nodes)
        clock.mark()
        tree = proposal.tree
        scores, feats = target.verify(tree, cache, features=proposer.needs_features, choices=greedy)
        clock.mark()
        result = accept_choices(tree, scores.tolist()) if greedy else accept(tree, scores, config.sampling, gen)
        target.commit(cache, past, result.path)
        clock.mark()
        propose_time, verify_time, accept_time = clock.spans()
        proposer.observe(len(tree), verify_time)

        features = None if feats is None else accepted_rows(feats, result.path)
        committed.extend(tree.tokens[i] for i in result.path)
        new = [tree.tokens[i] for i in result.path[1:]] + [result.bonus]
        new = cut_at_stop(new, stops, config.max_new_tokens - emitted)
        emitted += len(new)
        root = result.bonus
        # The measured draft/search split comes from the proposer; whatever else propose() spent counts as draft.
        draft_time = propose_time - proposal.search_time
        step = StepRecord(
            index=index, kind="verify", context_len=past, new_tokens=new, accepted=result.accepted, tree=tree,
            path=result.path, rows_tokens=proposal.rows_tokens, rows_probs=proposal.rows_probs,
            candidates=proposal.candidates, lookup_nodes=list(proposal.lookup_nodes or []), budget=proposal.budget,
            timings={"draft": draft_time, "search": proposal.search_time, "verify": verify_time, "accept": accept_time})
        step.stop_reason = _stop_reason(new, stops, emitted, config.max_new_tokens, len(committed) + 1, max_context)
        step.elapsed = time.perf_counter() - start
        yield step
        index += 1


def accepted_rows(rows: torch.Tensor, path: list[int]) -> torch.Tensor:
    """rows[path]: a view where the path is the first rows (every step of a chain: plain decoding, prompt lookup), which
    costs a few µs where indexing by a list cost 50-70 on a CPU."""
    if path == list(range(len(path))):
        return rows[: len(path)]
    return rows[path]


def cut_at_stop(ids: list[int], stops, limit: int) -> list[int]:
    """`ids` cut after the first stop token and to at most `limit` tokens: what a decode emits, by any method."""
    for i, t in enumerate(ids):
        if t in stops:
            ids = ids[: i + 1]
            break
    return list(ids[: max(limit, 0)])


def _stop_reason(new, stops, emitted, max_new, seq_len, max_context) -> str | None:
    if any(t in stops for t in new):
        return "stop_token"
    if emitted >= max_new:
        return "max_new_tokens"
    if seq_len >= max_context:
        return "context_full"
    return None


def run(target: TargetModel, proposer: Proposer, prompt_ids: list[int], config: GenerationConfig,
        settings: RunSettings | None = None) -> Trace:
    """Decode to the end and return the whole trace."""
    trace = Trace(method=proposer.name, prompt_ids=list(prompt_ids), settings=settings or RunSettings())
    for step in generate(target, proposer, prompt_ids, config):
        trace.steps.append(step)
    return trace


def verify_once(target: TargetModel, context: list[int], tree, sampling: SamplingConfig | None = None):
    """Verify one tree after `context` (committed tokens + root) in a fresh cache: the what-if tool's check.

    Returns the Acceptance (accepted path and bonus token) the target gives that tree.
    """
    sampling = sampling or SamplingConfig()
    if tree.tokens[0] != context[-1]:
        raise ValueError("the tree's root must be the last context token")
    cache = target.new_cache()
    target.prefill(list(context[:-1]), cache)
    logits, _ = target.verify(tree, cache)
    gen = None if sampling.greedy else sampling.make_generator()
    return accept(tree, logits, sampling, gen)
