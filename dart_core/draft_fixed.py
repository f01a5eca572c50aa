"""The draft head's step at fixed shapes: its keys and values in a static cache, the new positions padded to a bucket,
attention over the cache's whole capacity under a mask. At fixed shapes a step is captured once per bucket as a CUDA
graph and replayed: one launch instead of the head's few dozen, which on a GPU is most of its step (the target's
steps do the same: dart_core.fixed_step). On any device the same code also runs eagerly (the tests run it so on the
CPU), so what a GPU replays is what the suite checks against the head's own forward.

A step computes what DraftHead.forward computes. Row r of a bucket of B new positions writes its key and value at
cache entry P + r (P: the entries kept so far): the S real positions where they stay, the padded rows and the K mask
slots past them, where the next step overwrites them. A real row sees the cache and the real rows up to itself; a
padded row sees itself only; mask slot m sees the cache, every real row and the slots up to m, at positions
P + S + m, as in the head's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import fixed_step
from .draft_head import DraftHead, rope
from .lean_forward import CUDA, EAGER, FIXED_CAPACITY, StaticKV

BUCKETS = (1, 2, 4, 8, 16)   # new positions a step is padded to; more (the prompt's) run eagerly at their own shape


@dataclass
class _Bucket:
    """One bucket's inputs, outputs and (on a GPU) its graph: replaying it reads the inputs and fills `logits`. Its
    positions, cache entries and mask the step computes from P and S (`sizes`), copied from the host with the rows."""
    features: torch.Tensor     # [B, 3H]
    embeds: torch.Tensor       # [B, H]
    sizes_host: torch.Tensor   # [2] int64 on the host: P (the cache entries kept) and S (the real rows)
    sizes: torch.Tensor        # the same on the device, where the step reads them
    logits: torch.Tensor | None = None
    graph: object | None = None


class FixedDraft:
    """The head's drafting steps at fixed shapes, a bucket each, over one cache: the target's kind of static cache
    (dart_core.lean_forward.StaticKV) with one layer. Its graphs read the cache's tensor: they are captured all at once
    when the cache is made, and again when it grows (as the target's are, dart_core.fixed_step)."""

    def __init__(self, head: DraftHead, out_weight: torch.Tensor | None, output=None, graphs: str = EAGER,
                 capacity: int = FIXED_CAPACITY):
        self.head, self.out_weight, self.output, self.graphs = head, out_weight, output, graphs
        self.capacity = capacity
        self.cache: StaticKV | None = None
        self.buckets: dict[int, _Bucket] = {}

    def new_cache(self) -> StaticKV:
        """The cache for a new decode: the last one emptied (its buckets' graphs read it: captured once, replayed by
        every decode), or a first one."""
        if self.cache is None:
            c, embed = self.head.config, self.head.mask_embed
            self.cache = StaticKV(1, c.num_kv_heads, c.head_dim, self.capacity, embed.dtype, embed.device)
            self._capture_all(0)
        self.cache.length = 0
        return self.cache

    @torch.inference_mode()
    def step(self, features: torch.Tensor, embeds: torch.Tensor, cache: StaticKV) -> torch.Tensor:
        """As DraftHead.forward: the S new positions' features [S, 3H] and embeddings [S, H] appended to `cache`;
        returns logits [K + 1, Vd]."""
        if cache is not self.cache:
            raise ValueError("a FixedDraft steps over the cache it made last (new_cache)")
        S, K, P = features.shape[0], self.head.config.n_mask, cache.length
        size = next((b for b in BUCKETS if b >= S), S)
        kv = cache.kv
        cache.reserve(P + size + K)
        if cache.kv is not kv:   # grown: the graphs read the old tensor
            self.buckets = {}
            self._capture_all(P)
        bucket = self.buckets.get(size) or self._bucket(size, P)
        self._fill(bucket, features, embeds, P, S)
        if bucket.graph is not None:
            bucket.graph.replay()
        else:
            bucket.logits = self._compute(bucket)
        cache.length = P + S
        return bucket.logits.clone()

    @torch.inference_mode()
    def _capture_all(self, past: int) -> None:
        """Where the steps are captured, every bucket now: no step of a decode captures (its time would count it)."""
        if self.graphs == CUDA:
            for size in BUCKETS:
                self._bucket(size, past)

    def _bucket(self, size: int, past: int) -> _Bucket:
        c, device = self.head.config, self.cache.kv.device
        dtype = self.head.mask_embed.dtype
        sizes_host = torch.tensor([past, 0])   # no real row: warm-ups write past the kept entries
        bucket = _Bucket(torch.zeros(size, 3 * c.hidden_size, device=device, dtype=dtype),
                         torch.zeros(size, c.hidden_size, device=device, dtype=dtype), sizes_host,
                         fixed_step.on(device, sizes_host))
        if size in BUCKETS:
            if self.graphs == CUDA:
                bucket.graph, (bucket.logits,) = fixed_step.capture_graph(lambda: (self._compute(bucket),))
            self.buckets[size] = bucket
        return bucket

    def _fill(self, bucket: _Bucket, features, embeds, P: int, S: int) -> None:
        """The S real rows' inputs (the padded rows' are never seen) and P, S: one copy each."""
        bucket.features[:S] = features
        bucket.embeds[:S] = embeds
        bucket.sizes_host[0], bucket.sizes_host[1] = P, S
        bucket.sizes.copy_(bucket.sizes_host, non_blocking=True)   # from pageable memory: staged before it returns

    def _layout(self, bucket: _Bucket, span: int):
        """From P and S on the device: each row's rotary position and cache entry, what it sees [B + K, span], and
        the rows whose logits the step returns (the last real row and the slots)."""
        size, K = bucket.features.shape[0], self.head.config.n_mask
        P, S = bucket.sizes[0], bucket.sizes[1]
        device = bucket.sizes.device
        row = torch.arange(size + K, device=device)
        slot = row - size                                           # a mask slot's index (rows from `size`)
        positions = torch.where(row < S, P + row, torch.where(slot >= 0, P + S + slot, P))
        # the real rows causal over the cache and themselves, a padded row only itself (as the target's rows); each
        # slot the cache, the real rows and the slots up to itself
        causal = torch.ones(size, size, dtype=torch.bool, device=device).tril()
        entry = torch.arange(span, device=device)[None] - P         # cache entries from the first new row's
        slots_see = (entry < S) | ((entry >= size) & (entry - size <= slot[size:, None]))
        mask = torch.cat([fixed_step.sees(causal, P, S, span), slots_see])
        rows = torch.cat([(S - 1).clamp(min=0)[None], row[size:]])   # S = 0: warm-ups
        return positions, P + row, mask, rows

    def _compute(self, bucket: _Bucket) -> torch.Tensor:
        """The step's arithmetic from the bucket's inputs (what a graph captures): DraftHead.forward's, the keys and
        values written at `write`, the attention over the whole cache under `mask`."""
        head, c = self.head, self.head.config
        keys, values = self.cache.kv[0]
        positions, write, mask, rows = self._layout(bucket, self.cache.capacity)
        K, H, T = c.n_mask, c.hidden_size, positions.shape[0]
        x, g = head._input(bucket.features, bucket.embeds)
        x = torch.cat([x, head.mask_embed.to(x.dtype).expand(K, -1)], dim=0)
        residual = torch.cat([g, head.mask_embed[:H].to(g.dtype).expand(K, -1)], dim=0)
        q = head.q_proj(x).view(T, c.num_heads, c.head_dim).transpose(0, 1)
        k = head.k_proj(x).view(T, c.num_kv_heads, c.head_dim).transpose(0, 1)
        v = head.v_proj(x).view(T, c.num_kv_heads, c.head_dim).transpose(0, 1)
        q, k = rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta)
        keys.index_copy_(1, write, k.to(keys.dtype))
        values.index_copy_(1, write, v.to(values.dtype))
        rep = c.num_heads // c.num_kv_heads
        attn = F.scaled_dot_product_attention(q, keys.repeat_interleave(rep, 0).to(q.dtype),
                                              values.repeat_interleave(rep, 0).to(q.dtype), attn_mask=mask)
        h = residual + head.o_proj(attn.transpose(0, 1).reshape(T, -1))
        return head._mlp_and_logits(h.index_select(0, rows), self.out_weight, self.output)
