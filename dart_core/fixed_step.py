"""The lean forward at fixed shapes: rows padded to a bucket, attention over the cache's whole capacity under a mask,
keys and values written at index tensors. At fixed shapes a step can be captured once as a CUDA graph and replayed:
one launch instead of hundreds, which is most of a small model's step on a GPU. On any device the same fixed-shape
code also runs eagerly (the tests run it so on the CPU), so what a GPU replays is what the suite checks.

A padded row writes its keys and values past the tree's rows (entries the cache does not count yet) and sees only
itself; the tree's rows never see them. One FixedStep serves one cache (its graphs read that cache's tensor), and
comes back with the cache when `LeanForward.new_cache` hands it out again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

FIXED_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # rows a step is padded to
WARMUP_RUNS = 2   # eager runs before a capture (on a side stream, as CUDA graph capture asks)


@dataclass
class Captured:
    """One bucket's inputs, outputs and (on a GPU) its graph: replaying it reads the inputs and fills the outputs.
    The inputs come from the host in two copies a step (`host` and `block_host` to `inputs` and `block`); everything
    else a step needs (the cache entries it writes, the mask over the cache) the step computes from them."""
    host: torch.Tensor         # [2B + 2] int64 on the host: token ids (padding 0), positions, then past and n
    block_host: torch.Tensor   # [B, B] bool on the host: what each of the n real rows sees of the block
    inputs: torch.Tensor       # the two on the device, where the step reads them
    block: torch.Tensor
    logits: torch.Tensor | None = None
    feats: torch.Tensor | None = None
    graph: object | None = None


class FixedStep:
    """One cache's fixed-shape steps, a bucket each. They always compute the lean forward's feature taps, so plain
    decoding and DART share them (the bench alternates the two)."""

    def __init__(self, lean, cache):
        self.lean, self.cache = lean, cache
        self.kv = cache.kv            # the tensor the graphs read: a grown cache needs a new FixedStep
        self.buckets: dict[int, Captured] = {}

    def fits(self, cache) -> bool:
        return cache.kv is self.kv

    def run(self, ids: torch.Tensor, positions: torch.Tensor, block_mask: torch.Tensor | None, last_only: bool,
            features: bool):
        """ids, positions [n] and block_mask [n, n] (None: causal) on the host: the step's inputs are written there
        and copied to the device in two copies, which the device does not wait for."""
        cache, n = self.cache, ids.shape[0]
        past = cache.length
        bucket = next(b for b in FIXED_BUCKETS if b >= n)
        step = self.buckets.get(bucket) or self._prepare(bucket)
        host = step.host.numpy()
        host[:n], host[n:bucket] = ids.cpu().numpy(), 0
        host[bucket: bucket + n], host[bucket + n: 2 * bucket] = positions.cpu().numpy(), past
        host[2 * bucket:] = past, n
        block = step.block_host.numpy()
        block[:] = False
        block[:n, :n] = block_mask.cpu().numpy() if block_mask is not None else np.tri(n, dtype=bool)
        step.inputs.copy_(step.host, non_blocking=True)   # from pageable memory: staged before the call returns
        step.block.copy_(step.block_host, non_blocking=True)
        if step.graph is not None:
            step.graph.replay()
        else:
            step.logits, step.feats = self._step(step)
        cache.length = past + n
        logits = step.logits[n - 1: n] if last_only else step.logits[:n]
        return logits.clone(), step.feats[:n].clone() if features else None

    def capture_all(self) -> None:
        """Where the steps are captured, every bucket now (the head's steps do the same: dart_core.draft_fixed)."""
        if self.lean.graphs == "cuda":
            for bucket in FIXED_BUCKETS:
                self._prepare(bucket)

    def _step(self, step: Captured):
        """The step from its inputs on the device (what a graph captures): the rows' ids and positions, the cache
        entries past..past + B - 1 they write, and what each row sees."""
        bucket, inputs = step.block.shape[0], step.inputs
        past, n = inputs[2 * bucket], inputs[2 * bucket + 1]
        rows = torch.arange(bucket, device=inputs.device)
        mask = sees(step.block, past, n, self.kv.shape[3])
        return self.lean.step(inputs[:bucket], inputs[bucket: 2 * bucket], self.kv, past + rows, self.kv.shape[3],
                              mask, self.lean.taps, False)

    def _prepare(self, bucket: int) -> Captured:
        device, past = self.kv.device, self.cache.length
        host = torch.zeros(2 * bucket + 2, dtype=torch.long)
        host[bucket: 2 * bucket + 1] = past   # and n = 0, no real row: warm-ups write past the valid entries
        block_host = torch.zeros(bucket, bucket, dtype=torch.bool)
        step = Captured(host, block_host, on(device, host), on(device, block_host))
        if self.lean.graphs == "cuda":
            step.graph, (step.logits, step.feats) = capture_graph(lambda: self._step(step))
        self.buckets[bucket] = step
        return step


def capture_graph(fn):
    """fn's kernels captured once as a CUDA graph, after warm-up runs on a side stream (as capture asks): returns the
    graph and fn's outputs, which every `graph.replay()` fills again from the inputs fn read."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_RUNS):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # each graph keeps its own memory pool: buckets replay in any order, so none may reuse another's buffers
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def on(device, host: torch.Tensor) -> torch.Tensor:
    """A copy of `host` on `device`: a buffer of its own, where a step's inputs are copied to (on a CPU too, so that
    the host's buffer can be written for the next step as on a GPU)."""
    return torch.empty_like(host, device=device).copy_(host)


def sees(block: torch.Tensor, past, n, span: int) -> torch.Tensor:
    """[B, span] bool, what each of a bucket's B rows sees of the cache: a real row (the first n) the `past` entries
    before the block and, inside it, what `block` [B, B] says; a padded row only its own entry, past + row. past and
    n may be device tensors (a captured step reads them there: no value goes to the host)."""
    rows = torch.arange(block.shape[0], device=block.device)[:, None]
    inside = torch.arange(span, device=block.device)[None] - past          # entries from the block's first
    in_block = (inside >= 0) & (inside < n)
    of_block = block.gather(1, inside.clamp(0, block.shape[0] - 1).expand(block.shape[0], span))
    real = rows < n
    return (real & ((inside < 0) | (in_block & of_block))) | (~real & (inside == rows))


def block_or_causal(block_mask: torch.Tensor | None, n: int, device) -> torch.Tensor:
    """What a block's n rows see of the block itself: the tree's mask, or (None) the causal one."""
    return block_mask if block_mask is not None else torch.ones(n, n, dtype=torch.bool, device=device).tril()


def fixed_step(lean, cache) -> FixedStep:
    """The cache's FixedStep (made, with room for the largest bucket, where it has none that fits). Where the steps are
    captured, a new one captures every bucket at once: the first step over a cache pays for them all, and no later
    step captures (mid-decode, a capture would land in the time a run measures)."""
    cache.reserve(cache.length + FIXED_BUCKETS[-1])
    if cache.fixed is None or not cache.fixed.fits(cache):
        cache.fixed = FixedStep(lean, cache)
        cache.fixed.capture_all()
    return cache.fixed
