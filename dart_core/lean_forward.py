"""The target's forward of our own, for the Llama / Qwen2 / Qwen3 / Mistral families, over a static KV cache.

transformers' forward is general: per call it builds masks, cache objects and kwargs dicts, and runs seven
projections a layer. Here a decode step is the model's arithmetic and little else: the q/k/v and gate/up projections
are fused into one matrix each (four matrix products a layer, not seven), the KV cache is one tensor per layer
allocated once and written in place, and committing a tree's accepted path is an index copy on the device. The
forward is a plain function of tensors, so a CUDA graph can capture it whole.

It reads the transformers model's own weights and modules (norms' eps, the rotary embedding with its scaling) and
copies only the fused projections (and Qwen3's q and k norms, side by side). `LeanForward.unsupported(model)` says
why a model cannot take it (sliding-window layers, an unknown activation, ...); the target then keeps transformers'
forward. On a GPU the steps run at fixed shapes, captured as CUDA graphs (dart_core.fixed_step); on a CPU in fp32 the
decode and verify steps run in our C layer (dart_core.lean_native). tests/test_lean_forward.py checks it against
transformers' forward and decodes losslessly with it: at its own shapes, at fixed ones and in the C layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .acceptance import greedy_ids
from .fixed_step import FIXED_BUCKETS, block_or_causal, fixed_step

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
FREE_CACHES = 4          # caches kept for the next decodes (with their graphs), enough for the app's lanes
# Where the steps run at fixed shapes, a cache's capacity is a power of two of at least this many entries: each cache
# captures its own graphs, so caches sized to each prompt would capture again whenever a prompt is longer than the
# last (mid-decode, in the time a bench measures); sized so, one cache serves every prompt up to several hundred
# tokens. The attention reads the whole capacity under a mask: 1,024 entries are little beside a step's weights.
FIXED_CAPACITY = 1024
OFF, EAGER, CUDA = "off", "eager", "cuda"
DYNAMIC_ROPE = ("dynamic", "longrope")   # rotary scalings that change with the positions seen: not at fixed shapes


@dataclass
class LayerWeights:
    """One decoder layer's parameters as the lean forward uses them. The projections are nn.Linear modules, so that
    the kernel plan (dart_core.machine.kernels.FastLinears) can put each on the kernel measured fastest for its rows."""
    norm_in: torch.Tensor
    qkv: torch.nn.Linear              # q, k and v projections stacked: [(H + 2 KV) d, hidden]
    qk_norm: torch.Tensor | None      # Qwen3 normalizes each head's q and k before the rotation: [H + KV, d]
    o: torch.nn.Linear
    norm_post: torch.Tensor
    gate_up: torch.nn.Linear          # gate and up projections stacked: [2 I, hidden]
    down: torch.nn.Linear


class StaticKV:
    """The KV cache as one preallocated tensor per layer, [kv_heads, capacity, head_dim] keys and values; `length`
    entries are valid. Grows (by doubling, copying once) only where a run outlives its capacity. Its tensor is made
    and edited in inference mode, as the forwards that write it run."""

    @torch.inference_mode()
    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype, device):
        shape = (layers, 2, kv_heads, max(capacity, 1), head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self.fixed = None   # its fixed-shape step (dart_core.fixed_step), graphs and all, made at the first use

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    def get_seq_length(self) -> int:
        return self.length

    @torch.inference_mode()
    def reserve(self, length: int) -> None:
        if length > self.capacity:
            grown = self.kv.new_zeros((*self.kv.shape[:3], max(length, 2 * self.capacity), self.kv.shape[4]))
            grown[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
            self.kv = grown

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back a cache of {self.length} entries to {length}")
        self.length = length

    @torch.inference_mode()
    def keep(self, past: int, kept: list[int]) -> None:
        """After a verify block at `past`, keep entries past + kept[i] (in order) at past + i: an accepted path's
        entries out of place copied down one by one, any other order by one gather. `kept` is a host list: on a GPU
        reading a device tensor back would wait for the device twice."""
        n = len(kept)
        if n and max(kept) >= self.length - past:
            raise ValueError("kept node outside the verified block")
        moves = [(i, k) for i, k in enumerate(kept) if k != i]
        if all(k > i for i, k in moves) and all(a[1] < b[1] for a, b in zip(moves, moves[1:])):
            # an accepted path (increasing nodes): its few entries out of place, each moved down by one copy; no
            # source is overwritten before it is read (a gather of the whole block cost 0.3 ms on a CPU)
            for i, k in moves:
                self.kv[:, :, :, past + i] = self.kv[:, :, :, past + k]
        else:
            self.kv[:, :, :, past: past + n] = self.kv[:, :, :, past + torch.tensor(kept, device=self.kv.device)]
        self.length = past + n


class LeanForward:
    """The model's forward over a StaticKV, from the transformers model's weights (fused copies of the
    projections; everything else shared)."""

    def __init__(self, model, taps: tuple[int, ...] = ()):
        """taps: the layers whose inputs the drafts read (TargetModel.taps): the fixed-shape steps compute them."""
        why = self.unsupported(model)
        if why:
            raise ValueError(f"the lean forward cannot run {type(model).__name__}: {why}")
        cfg = model.config
        inner = model.model
        self.heads, self.kv_heads, self.head_dim = attention_shape(cfg)
        self.eps = float(cfg.rms_norm_eps)
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.norm_out = inner.norm.weight
        self.output = model.get_output_embeddings()
        self.layers = [self._layer(layer) for layer in inner.layers]
        self.taps = tuple(taps)
        self._free: list[StaticKV] = []
        # fixed-shape steps: captured as CUDA graphs on a GPU (CUDA), run eagerly (EAGER: the same code on any
        # device, as the tests run it), or not used (OFF: every step at its own shape)
        self.graphs = CUDA if self.embed.device.type == "cuda" else OFF
        self.native = None   # on a CPU: the C layer for decode and verify steps (dart_core.lean_native)

    @staticmethod
    def unsupported(model) -> str | None:
        """Why this model cannot take the lean forward, or None."""
        cfg = getattr(model, "config", None)
        kind = getattr(cfg, "model_type", None)
        if kind not in FAMILIES:
            return f"model type {kind!r} (the lean forward knows {', '.join(FAMILIES)})"
        if getattr(cfg, "hidden_act", "silu") != "silu":
            return f"activation {cfg.hidden_act!r}"
        if "sliding_attention" in (getattr(cfg, "layer_types", None) or ()) or \
                (kind == "mistral" and getattr(cfg, "sliding_window", None)):
            return "sliding-window attention"
        if getattr(cfg, "mlp_bias", False) or getattr(cfg, "final_logit_softcapping", None):
            return "MLP biases or logit soft-capping"
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type")) in DYNAMIC_ROPE:
            return f"rotary scaling {rope.get('rope_type', rope.get('type'))!r} (its frequencies follow the context)"
        return None

    def _layer(self, layer) -> LayerWeights:
        att, mlp = layer.self_attn, layer.mlp
        norm = getattr(att, "q_norm", None)
        qk_norm = None if norm is None else torch.cat([norm.weight[None].expand(self.heads, -1),
                                                       att.k_norm.weight[None].expand(self.kv_heads, -1)])
        return LayerWeights(
            norm_in=layer.input_layernorm.weight, qkv=_stacked([att.q_proj, att.k_proj, att.v_proj]),
            qk_norm=qk_norm, o=att.o_proj, norm_post=layer.post_attention_layernorm.weight,
            gate_up=_stacked([mlp.gate_proj, mlp.up_proj]), down=mlp.down_proj)

    def linears(self) -> list[torch.nn.Linear]:
        """Every projection the forward computes, the output layer last: what a kernel plan chooses for."""
        return [m for w in self.layers for m in (w.qkv, w.o, w.gate_up, w.down)] + [self.output]

    def new_cache(self, capacity: int) -> StaticKV:
        """A cache for one decode: a released one that is large enough (its captured graphs come with it), else a new
        one. Hand it back with `release` when the decode ends."""
        for cache in self._free:
            if cache.capacity >= capacity:
                self._free.remove(cache)
                cache.length = 0
                return cache
        if self.graphs != OFF:
            capacity = max(FIXED_CAPACITY, 1 << max(capacity - 1, 0).bit_length())
        # the C layer keeps keys and values in fp32 whatever the weights (lean_native)
        dtype = torch.float32 if self.native is not None else self.embed.dtype
        return StaticKV(len(self.layers), self.kv_heads, self.head_dim, capacity, dtype, self.embed.device)

    def release(self, cache: StaticKV) -> None:
        """`cache`'s decode is over: keep it (at most FREE_CACHES) for the next one."""
        if cache not in self._free:
            self._free = [cache, *self._free][:FREE_CACHES]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: StaticKV, block_mask: torch.Tensor | None,
                taps: tuple[int, ...] = (), last_only: bool = False, choices: bool = False):
        """ids, positions [n] appended at cache.length; block_mask [n, n] (bool: row i sees block entry j) or None
        for a causal block. Returns logits [n or 1, V] (with `choices`, each row's greedy choice instead, [n or 1])
        and the tap layers' inputs [n, 3H] (None without taps). The inputs are best given on the host: the
        fixed-shape steps read them there, and the others copy them to the device without waiting for it."""
        past, n = cache.length, ids.shape[0]
        graphs = self.graphs != OFF and n <= FIXED_BUCKETS[-1] and taps in ((), self.taps)
        if not graphs and self.native is not None and self.native.serves(n, block_mask):
            return self.native.forward(ids, positions, cache, block_mask, taps, last_only, choices)
        if graphs:
            logits, feats = fixed_step(self, cache).run(ids, positions, block_mask, last_only, features=bool(taps))
        else:
            device = self.embed.device
            ids, positions = ids.to(device, non_blocking=True), positions.to(device, non_blocking=True)
            block_mask = None if block_mask is None else block_mask.to(device, non_blocking=True)
            cache.reserve(past + n)
            mask = None
            if n > 1:   # the cache is seen whole; inside the block, the tree's (or the causal) mask
                mask = torch.cat([torch.ones(n, past, dtype=torch.bool, device=ids.device),
                                  block_or_causal(block_mask, n, ids.device)], dim=1)
            logits, feats = self.step(ids, positions, cache.kv, past, past + n, mask, taps, last_only)
            cache.length = past + n
        return (greedy_ids(logits) if choices else logits), feats

    def step(self, ids, positions, kv, write, span: int, mask, taps: tuple[int, ...], last_only: bool):
        """The arithmetic of one forward. write: where the block's keys and values go in the cache (an int: at that
        offset; a tensor: at those indices); span: how many cache entries the attention reads (mask [n, span])."""
        hidden = F.embedding(ids, self.embed)[None]                       # [1, n, hidden]
        cos, sin = self.rotary(hidden, positions[None])
        cos, sin = cos[:, :, None], sin[:, :, None]                        # [1, n, 1, d]: every head alike
        attn_mask = mask[None, None] if mask is not None else None
        captured = {}
        for i, w in enumerate(self.layers):
            if i in taps:
                captured[i] = hidden
            hidden = hidden + self._attention(w, _rms(hidden, w.norm_in, self.eps), cos, sin, kv[i], write, span,
                                              attn_mask)
            x = _rms(hidden, w.norm_post, self.eps)
            gate, up = w.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + w.down(F.silu(gate) * up)
        hidden = _rms(hidden, self.norm_out, self.eps)
        if last_only:
            hidden = hidden[:, -1:]
        logits = self.output(hidden)[0]
        feats = torch.cat([captured[i] for i in taps], dim=-1)[0] if taps else None   # taps may repeat a layer
        return logits, feats

    def _attention(self, w: LayerWeights, x, cos, sin, kv, write, span: int, attn_mask):
        n, heads = x.shape[1], self.heads
        qkv = w.qkv(x).view(1, n, heads + 2 * self.kv_heads, self.head_dim)
        qk, v = qkv[:, :, : heads + self.kv_heads], qkv[:, :, heads + self.kv_heads:].transpose(1, 2)
        if w.qk_norm is not None:
            qk = _rms(qk, w.qk_norm, self.eps)
        qk = _rotate(qk, cos, sin)   # q's heads and k's at once: the same arithmetic, half the operations
        q, k = qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2)
        if isinstance(write, int):
            kv[0, :, write: write + n] = k[0]
            kv[1, :, write: write + n] = v[0]
        else:   # fixed shapes (a captured graph): the indices are a tensor the graph reads
            kv[0].index_copy_(1, write, k[0])
            kv[1].index_copy_(1, write, v[0])
        keys, values = kv[0, None, :, :span], kv[1, None, :, :span]
        if keys.dtype != q.dtype:   # a bf16 prefill into the C layer's fp32 cache
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask, scale=self.head_dim ** -0.5,
                                             enable_gqa=self.kv_heads != self.heads)
        return w.o(out.transpose(1, 2).reshape(1, n, heads * self.head_dim))


def attention_shape(cfg) -> tuple[int, int, int]:
    """(query heads, key/value heads, head size) of a model's config."""
    heads = int(cfg.num_attention_heads)
    return heads, int(getattr(cfg, "num_key_value_heads", None) or heads), \
        int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)


def _stacked(linears: list[torch.nn.Linear]) -> torch.nn.Linear:
    """One nn.Linear computing `linears` side by side (a missing bias is zeros where another has one)."""
    first = linears[0]
    has_bias = any(m.bias is not None for m in linears)
    out = torch.nn.Linear(first.in_features, sum(m.out_features for m in linears), bias=has_bias,
                          dtype=first.weight.dtype, device=first.weight.device)
    with torch.no_grad():
        out.weight.copy_(torch.cat([m.weight for m in linears]))
        if has_bias:
            out.bias.copy_(torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
                                      for m in linears]))
    return out.eval().requires_grad_(False)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: the statistics in fp32, the weight applied in the input's dtype (a weight per head for
    Qwen3's q and k norms broadcasts alike)."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
