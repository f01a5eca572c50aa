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

import torch

FIXED_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # rows a step is padded to
WARMUP_RUNS = 2   # eager runs before a capture (on a side stream, as CUDA graph capture asks)


@dataclass
class Captured:
    """One bucket's inputs, outputs and (on a GPU) its graph: replaying it reads the inputs and fills the outputs."""
    ids: torch.Tensor          # [B] token ids (padding: 0)
    positions: torch.Tensor    # [B] positions (padding: the block's first)
    write: torch.Tensor        # [B] cache entries the rows' keys and values go to: past .. past + B - 1
    mask: torch.Tensor         # [B, capacity] bool: what each row sees
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
        cache, n = self.cache, ids.shape[0]
        past = cache.length
        bucket = next(b for b in FIXED_BUCKETS if b >= n)
        step = self.buckets.get(bucket) or self._prepare(bucket)
        step.ids.zero_()
        step.ids[:n] = ids
        step.positions.fill_(past)
        step.positions[:n] = positions
        step.write.copy_(torch.arange(past, past + bucket, device=ids.device))
        fill_mask(step.mask, past, n, block_mask)
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
        return self.lean.step(step.ids, step.positions, self.kv, step.write, self.kv.shape[3], step.mask,
                              self.lean.taps, False)

    def _prepare(self, bucket: int) -> Captured:
        device, past = self.kv.device, self.cache.length
        write = torch.arange(past, past + bucket, device=device)   # entries past the valid ones: warm-ups may write
        step = Captured(torch.zeros(bucket, dtype=torch.long, device=device), write.clone(), write,
                        torch.zeros(bucket, self.kv.shape[3], dtype=torch.bool, device=device))
        step.mask[torch.arange(bucket, device=device), write] = True
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


def fill_mask(mask: torch.Tensor, past: int, n: int, block_mask: torch.Tensor | None) -> None:
    """Rows see the cache's `past` entries and, inside the block, the tree's mask (None: causal); padded rows see
    only their own entry."""
    bucket = mask.shape[0]
    mask.zero_()
    mask[:n, :past] = True
    mask[:n, past: past + n] = block_or_causal(block_mask, n, mask.device)
    pad = torch.arange(n, bucket, device=mask.device)
    mask[pad, past + pad] = True


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
