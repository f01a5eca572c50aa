"""The DART draft head's drafting step on a CPU through our C layer (machine/lean_layer.c), with bf16 or int8 weights.

As torch operations a drafting step is nine small products and some sixty other operations, each dispatched on its
own and run cold after the target's forward streamed its weights through the caches: on a 2-core CPU that took about
as long as the products (docs/cpu-speed.md, section 8). Here the head's one decoder layer is one call, its input rows
are assembled by another, and every product reads the weights in bf16, half of fp32's bytes, or in int8 with a
scale per output, a quarter (`--draft-kernels native-int8`; the set-up code times both).

The head's own safetensors hold bf16 weights, so a head loaded from its file loses nothing in bf16; a head whose
weights are finer (fresh from training) drafts from their bf16 rounding, and int8 rounds them further. On a CPU with
AMX the bf16 products run on AMX tiles (machine/bf16_tiles.c), on one with AVX512-BF16 from the same tiles by
VDPBF16PS, each product's input rounded to bf16 too. Either way the draft only proposes: the target verifies every
token, so the emitted tokens never depend on it.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from .draft_head import DraftHead, rope_tables
from .lean_forward import StaticKV
from .lean_native import head_size_refused, kernels_unbuilt
from .machine import amx_tiles, few_rows
from .machine.few_rows import FewRowsKernel
from .machine.hardware import Hardware
from .machine.kernels import weights_version
from .machine.records import NATIVE_INT8_KERNELS, NATIVE_KERNELS

MIN_CACHE = 256          # positions a draft cache starts with (it doubles when a run goes past it)
WEIGHTS = {NATIVE_KERNELS: torch.bfloat16, NATIVE_INT8_KERNELS: torch.int8}   # the products' weights, by kernels


def unsupported(head: DraftHead, hardware: Hardware) -> str | None:
    """Why the C layer cannot draft with `head` on `hardware`, or None when it can."""
    if not hardware.is_cpu or head.mask_embed.device.type != "cpu":
        return "the C layer drafts on a CPU"
    return kernels_unbuilt(hardware) or head_size_refused(head.config.head_dim)


class NativeDraftHead:
    """`head` packed for the C layer: `step` is DraftHead.forward for inference, on a one-layer StaticKV (fp32)."""

    def __init__(self, head: DraftHead, kernel: FewRowsKernel, out_weight: torch.Tensor | None = None,
                 weights: torch.dtype = torch.bfloat16, tiles: str | None = None):
        """out_weight: the output layer of a head tied to the target's (as DraftHead.forward takes it); weights: the
        products' weights, bf16 or int8; tiles: how bf16 products run, "off" or a way on tiles (None: as
        amx_tiles.bf16_way chooses for this CPU)."""
        c = head.config
        self.config, self.kernel, self.weights = c, kernel, weights
        self.tiles = amx_tiles.bf16_way(kernel, weights, tiles)

        def packed(*linears):
            return amx_tiles.pack(kernel, torch.cat([w.detach().float() for w in linears]), weights, self.tiles)

        def flat(t):
            return t.detach().float().contiguous()

        self.fc = packed(head.fc.weight)
        self.layer = [packed(head.q_proj.weight, head.k_proj.weight, head.v_proj.weight), packed(head.o_proj.weight),
                      packed(head.gate_proj.weight, head.up_proj.weight), packed(head.down_proj.weight)]
        output = head.lm_head.weight if head.lm_head is not None else out_weight
        if output is None:
            raise ValueError("this head ties its output to the target: pass the target's output weight")
        self.output = packed(output)
        self.norms = [flat(n.weight) for n in (head.embed_norm, head.feature_norm, head.post_attn_norm)]
        self.final_norm = flat(head.final_norm.weight)
        self.mask = flat(head.mask_embed)
        self.standardize = (flat(head.feature_mean), flat(head.feature_std)) if c.standardize_features else None
        self.cos = self.sin = torch.empty(0, c.head_dim)

    def new_cache(self) -> StaticKV:
        """The keys and values of the head's real positions (the slots' go after them, to be overwritten)."""
        return StaticKV(1, self.config.num_kv_heads, self.config.head_dim, MIN_CACHE, torch.float32, "cpu")

    def _rotation(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [end - start, head_dim] of positions start..end-1, as draft_head.rope computes them."""
        if end > self.cos.shape[0]:
            size = max(end, 2 * self.cos.shape[0], MIN_CACHE)
            self.cos, self.sin = rope_tables(torch.arange(size), self.config.head_dim, self.config.rope_theta)
        return self.cos[start:end], self.sin[start:end]

    @torch.inference_mode()
    def step(self, features: torch.Tensor, embeds: torch.Tensor, cache: StaticKV) -> torch.Tensor:
        """features [S, 3H] of the S newly committed tokens, embeds [S, H] of the tokens after them; appends the S
        positions to `cache` and returns the logits [K+1, Vd] (rows: the last real position, then the K slots)."""
        c, lib = self.config, self.kernel.lib
        S, K, H, P = features.shape[0], c.n_mask, c.hidden_size, cache.length
        n = S + K
        features = features.float()
        if self.standardize is not None:
            features = (features - self.standardize[0]) / self.standardize[1]
        g = self.kernel.linear(features, self.fc, None)
        embeds = embeds.float().contiguous()
        x, h = torch.empty(n, 2 * H), torch.empty(n, H)
        lib.draft_input(embeds.data_ptr(), g.data_ptr(), self.mask.data_ptr(), self.norms[0].data_ptr(),
                        self.norms[1].data_ptr(), x.data_ptr(), h.data_ptr(), S, K, H, c.rms_eps)
        cache.reserve(P + n)   # the slots' keys and values go after the real ones, to be overwritten next step
        cos, sin = self._rotation(P, P + n)
        threads = torch.get_num_threads()
        heads, kv_heads, d, inter = c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
        qkv, o, gate_up, down = (w.blocks.data_ptr() for w in self.layer)
        cap, keys = cache.capacity, cache.kv.data_ptr()
        values, kind = keys + kv_heads * cap * d * 4, self.layer[0].kind
        # One layer: nothing reads the outputs of the real positions before the last, only their keys and values (a
        # step after plain steps catches up on many such positions)
        lead = S - 1
        if lead:
            scratch = torch.empty(lead * (heads + 2 * kv_heads) * d)
            lib.lean_layer_qkv(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), qkv, None, None, keys, values,
                               scratch.data_ptr(), lead, 2 * H, heads, kv_heads, d, P, cap, c.rms_eps, threads, kind)
        scratch = torch.empty(lib.lean_layer_scratch(n - lead, H, heads, kv_heads, d, inter, P + lead, threads))
        lib.lean_layer(h[lead].data_ptr(), x[lead].data_ptr(), cos[lead].data_ptr(), sin[lead].data_ptr(), None, None,
                       qkv, None, None, o, None, self.norms[2].data_ptr(), gate_up, down, keys, values,
                       scratch.data_ptr(), n - lead, H, 2 * H, heads, kv_heads, d, inter, P + lead, cap, c.rms_eps,
                       threads, kind)
        cache.length = P + S
        rows = h[lead:]
        for _ in range(2 if c.double_norm else 1):
            normed = torch.empty_like(rows)
            lib.lean_final_norm(rows.data_ptr(), self.final_norm.data_ptr(), normed.data_ptr(), K + 1, H, c.rms_eps)
            rows = normed
        return self.kernel.linear(rows, self.output, None)

    def top_rows(self, logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's top k of `step`'s logits [R, Vd] (draft ids, best first) and their softmax over the k, in one
        pass of our C code (machine/tree_search.c: draft_rows_top)."""
        logits = logits.float().contiguous()
        R, V = logits.shape
        ids, probs = np.empty((R, k), dtype=np.int64), np.empty((R, k), dtype=np.float32)
        self.kernel.lib.draft_rows_top(logits.data_ptr(), R, V, k, ids.ctypes.data, probs.ctypes.data,
                                       torch.get_num_threads())
        return ids, probs


def packed(head: DraftHead, hardware: Hardware, out_weight: torch.Tensor | None = None,
           weights: torch.dtype = torch.bfloat16, tiles: str | None = None) -> NativeDraftHead:
    """`head` packed for the C layer built for `hardware` (where `unsupported` says it can run), in `weights` (bf16 on
    tiles as `tiles` says); made once per head and weights, and kept while the head's weights are unchanged (the
    app builds a drafter for every run)."""
    key = (weights_version(head), hardware.kind)
    made = _PACKED.setdefault(head, {})
    known = made.get((weights, tiles))
    if known is not None and known[0] == key and known[1] is out_weight:
        return known[2]
    out = NativeDraftHead(head, few_rows.kernel(hardware.kind), out_weight, weights, tiles)
    made[(weights, tiles)] = (key, out_weight, out)
    return out


_PACKED: "weakref.WeakKeyDictionary[DraftHead, tuple]" = weakref.WeakKeyDictionary()
