"""The lean forward's decode and verify steps on a CPU through our C decoder layer (machine/lean_layer.c), computed in
fp32 on the model's fp32 or bf16 weights.

A step of a few rows is some thirty small operations a layer around four matrix products; as torch operations, each
run cold after a product streamed its weights through the caches, they cost a third of a step on a 2-core CPU. The
C layer does them in one call per layer, with the weights packed for our few-row kernel (machine/few_rows.c).

Every row is computed on its own in a fixed order, and the rotation reads one table of every position, so a verified
tree's rows get exactly the logits plain decoding gets for the same prefix (tests/test_lean_native.py). A prompt of
more than NATIVE_ROWS rows runs here NATIVE_ROWS rows at a time, each row's bits as if alone, up to the length at
which that was measured faster than the lean forward's torch step (setup/calibration.py: prefill_choice); longer
ones take that step. Plain decoding and DART prefill alike.

A bf16 model's weights are read in bf16 (widened exactly as they are loaded: half the bytes of fp32), its activations,
keys and values kept in fp32: a bf16 model's steps cost about half its fp32 steps, and, every row computed alone, DART
in bf16 is token-identical to plain decoding in bf16 too (a bf16 prefill writes its keys and values into the fp32
cache: LeanForward.new_cache). On a CPU with AMX a bf16 model's products run on AMX tiles instead (machine/bf16_tiles.c:
each row's input rounded to bf16, as torch's bf16 products round it), where many rows cost hardly more than one: a
verified tree costs little more than a plain step (docs/cpu-speed.md, section 17); on one with AVX512-BF16 and no AMX,
from the same tiles by VDPBF16PS, twice the FMAs' products an instruction (section 18).

An fp32 model whose decoder weights are Q4_1 blocks (the default model, dequantized from its Q4_1 file) is also packed
as those blocks, a sixth of the fp32 packing's bytes, and steps of up to q4_rows rows read them (as measured:
setup/calibration.py, q4_1_choice): the blocks' product gives the fp32 product's bits, so which packing a step reads
never changes a token (docs/cpu-speed.md, section 23).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from .acceptance import greedy_ids
from .greedy_output import GreedyOutput
from .lean_forward import LeanForward, attention_shape
from .machine import amx_tiles, few_rows, huge_pages
from .machine.few_rows import Q4_1, FewRowsKernel, PackedWeight, Reading, weight_kind

NATIVE_ROWS = 64          # rows a native step serves: decode steps, verified trees, a prompt's block at a time
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)   # the weights the C layer reads (it computes in fp32)
MIN_TABLE = 1024          # positions the rotation table starts with (it doubles when a run goes past it)
HEAD_DIM_STEP, MAX_HEAD_DIM = 16, 512   # the head sizes the C attention takes (lean_layer.c: VW, MAX_HEAD_DIM)
GREEDY_COPY = torch.int8   # the output layer's copy greedy steps read (greedy_output.py; docs/cpu-speed.md, section 11)
# Blocks of up to this many rows read fp32 weights that are Q4_1 blocks as such (more rows read the fp32 packing: their
# products are bound by arithmetic, which the blocks' rebuilding adds to)
Q4_1_ROWS = 16


def unsupported(model, hardware) -> str | None:
    """Why the C layer cannot decode `model` (as loaded) on `hardware`, or None: the one test of TargetModel.use_lean
    and of the dtype choice."""
    if not hardware.is_cpu:
        return "our kernels are not built here"
    why = kernels_unbuilt(hardware) or LeanForward.unsupported(model)
    if why is not None:
        return why
    weight = model.get_input_embeddings().weight
    if weight.dtype not in WEIGHT_DTYPES or weight.device.type != "cpu":
        return "the C layer runs fp32 and bf16 models on a CPU"
    heads, kv_heads, head_dim = attention_shape(model.config)
    if heads % kv_heads:
        return f"{heads} query heads over {kv_heads} key/value heads"
    return head_size_refused(head_dim)


def reads_q4_1_blocks(model, hardware) -> bool:
    """Whether the C layer would read this fp32 model's decoder as Q4_1 blocks (NativeLayers.q4_layers): its first
    layer's linears are such blocks (the load checks every linear as it packs it)."""
    if unsupported(model, hardware) is not None or model.get_input_embeddings().weight.dtype != torch.float32:
        return False
    kernel = few_rows.kernel(hardware.kind)
    first = [m for m in model.model.layers[0].modules() if isinstance(m, torch.nn.Linear)]
    return kernel is not None and bool(first) and all(kernel.pack_q4_1(m.weight) is not None for m in first)


def kernels_unbuilt(hardware) -> str | None:
    """Why our C kernels cannot run on `hardware` (a machine without them, or serving them by a stand-in), or None."""
    if not hardware.few_rows or "few_rows" in hardware.stand_ins:
        return "our kernels are not built here"
    return None


def head_size_refused(head_dim: int) -> str | None:
    """Why the C attention cannot take heads of `head_dim`, or None."""
    if head_dim % HEAD_DIM_STEP or head_dim > MAX_HEAD_DIM:
        return f"head size {head_dim} (the C layer takes multiples of {HEAD_DIM_STEP} up to {MAX_HEAD_DIM})"
    return None


class NativeLayers:
    """The lean forward's layers packed for the C layer, the rotation table, and the step that runs them."""

    def __init__(self, lean, kernel: FewRowsKernel, tiles: str | None = None):
        """tiles: how a bf16 model's products run: "off" (FMAs on the widened weights) or on tiles, "amx",
        "avx512-bf16" or "stand-in" (None: AMX where usable, else AVX512-BF16 where built, else off:
        amx_tiles.bf16_way)."""
        self.lean, self.kernel = lean, kernel
        self.max_rows = NATIVE_ROWS
        self.weights = lean.embed.dtype            # fp32 or bf16, as the model's
        self.tiles = amx_tiles.bf16_way(kernel, self.weights, tiles)      # "" where the products are FMAs
        self.weight_kind = weight_kind(self.weights, self.tiles)    # what lean_layer is told
        self.norm_out = _flat(lean.norm_out)
        self.layers = [self._packed(w) for w in lean.layers]   # (kept alive here)
        self.addresses = _addresses(self.layers)
        # fp32 weights that are Q4_1 blocks (a model dequantized from a Q4_1 file, as the default is) are also packed as
        # those blocks, which steps of up to q4_rows rows read: the same bits from a sixth of the bytes
        self.q4_layers = self._q4_packed(lean.layers) if self.weights == torch.float32 and not self.tiles else None
        self.q4_addresses = _addresses(self.q4_layers) if self.q4_layers else None
        self.q4_rows = Q4_1_ROWS if self.q4_layers else 0
        self.output = kernel.pack(lean.output.weight, self.weights)
        self.output_bias = _flat(lean.output.bias)
        # the packed weights on huge pages (machine/huge_pages.py): the largest, at least, was big enough to ask
        self.huge_pages = huge_pages.in_use() and self.output.blocks.nbytes >= huge_pages.HUGE_PAGE
        # greedy steps choose from a smaller copy of the output layer, exactly (greedy_output.py), up to the rows where
        # it was measured faster than the full layer (setup/calibration.py: greedy_copy_choice)
        self.greedy = GreedyOutput(lean.output.weight, kernel, GREEDY_COPY) if lean.output.bias is None else None
        self.greedy_rows = self.max_rows if self.greedy is not None else 0
        self.reading = Reading()   # how the products read the weights (as measured: setup/calibration.py)
        self.intermediate = lean.layers[0].down.in_features
        self.cos = self.sin = torch.empty(0, lean.head_dim)
        # causal blocks (prompts) of more rows than max_rows run here, max_rows at a time, up to this many rows (None:
        # any); as measured (setup/calibration.py: prefill_choice)
        self.prefill_rows: int | None = self.max_rows

    def serves(self, n: int, block_mask: torch.Tensor | None) -> bool:
        """Whether a block of n rows runs here: up to max_rows rows of any block (a step, a verified tree), and a
        causal block (a prompt) of up to prefill_rows."""
        return n <= self.max_rows or (block_mask is None and (self.prefill_rows is None or n <= self.prefill_rows))

    def _packed(self, w) -> list:
        """The layer's tensors (None where it has none), in lean_layer's order."""
        def pack(linear):
            return amx_tiles.pack(self.kernel, linear.weight, self.weights, self.tiles)

        return [_flat(w.norm_in), pack(w.qkv), _flat(w.qkv.bias), _flat(w.qk_norm), pack(w.o), _flat(w.o.bias),
                _flat(w.norm_post), pack(w.gate_up), pack(w.down)]

    def _q4_packed(self, layers) -> list | None:
        """The layers as _packed gives them, each linear packed as Q4_1 blocks; None unless every linear is such."""
        packed = []
        for w, fp32 in zip(layers, self.layers):
            linears = [self.kernel.pack_q4_1(linear.weight) for linear in (w.qkv, w.o, w.gate_up, w.down)]
            if any(p is None for p in linears):
                return None
            qkv, o, gate_up, down = linears
            packed.append([fp32[0], qkv, fp32[2], fp32[3], o, fp32[5], fp32[6], gate_up, down])
        return packed

    def _rotation(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [n, d] of `positions`, read from one table (so a position always gets the same bits)."""
        needed = int(positions.max()) + 1
        if needed > self.cos.shape[0]:
            size = max(needed, 2 * self.cos.shape[0], MIN_TABLE)
            probe = torch.zeros(1, 1, dtype=torch.float32)
            cos, sin = self.lean.rotary(probe, torch.arange(size)[None])
            self.cos, self.sin = cos[0].float().contiguous(), sin[0].float().contiguous()
        return self.cos[positions], self.sin[positions]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, block_mask: torch.Tensor | None,
                taps: tuple[int, ...], last_only: bool, choices: bool = False):
        """As LeanForward.forward: logits [n or 1, V] (with `choices`, the greedy choice of each row instead, [n or 1])
        and the tap layers' inputs [n, 3H] (None without taps). A causal block of more than max_rows rows runs
        max_rows rows at a time."""
        if block_mask is not None and ids.shape[0] > self.max_rows:
            raise ValueError(f"a block of {ids.shape[0]} rows with its own mask: the C layer takes {self.max_rows}")
        self.reading.apply(self.kernel)
        hidden, feats = [], []
        for start in range(0, ids.shape[0], self.max_rows):
            part = slice(start, start + self.max_rows)
            rows, captured = self._layers(ids[part], positions[part], cache, block_mask, taps)
            hidden.append(rows[-1:] if last_only else rows)
            feats.append(captured)
        rows = hidden[-1] if last_only else torch.cat(hidden)
        normed = torch.empty_like(rows)
        self.kernel.lib.lean_final_norm(rows.data_ptr(), self.norm_out.data_ptr(), normed.data_ptr(), rows.shape[0],
                                        rows.shape[1], self.lean.eps)
        feats = torch.cat(feats) if taps else None
        if choices and normed.shape[0] <= self.greedy_rows:
            return self.greedy.choose(normed), feats
        logits = self.kernel.linear(normed, self.output, self.output_bias)
        return (greedy_ids(logits) if choices else logits), feats

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, cache, block_mask: torch.Tensor | None,
                taps: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to max_rows rows through the decoder's layers, appended to the cache: their hidden states [n, D] before
        the last norm, and the tap layers' inputs [n, 3H] (None without taps)."""
        lean, lib, n = self.lean, self.kernel.lib, ids.shape[0]
        past = cache.length
        cache.reserve(past + n)
        hidden = F.embedding(ids, lean.embed).float().contiguous()            # [n, D], updated in place
        D, d, H, KV, I = hidden.shape[1], lean.head_dim, lean.heads, lean.kv_heads, self.intermediate
        cos, sin = self._rotation(positions)
        block = None if block_mask is None else block_mask.to(torch.bool).contiguous()
        threads = torch.get_num_threads()
        scratch = torch.empty(lib.lean_layer_scratch(n, D, H, KV, d, I, past, threads))
        tap_layers = (ctypes.c_long * max(len(taps), 1))(*taps)
        captured = torch.empty(n, len(taps) * D) if taps else None   # the tap layers' inputs, side by side
        q4 = n <= self.q4_rows
        lib.lean_layers(hidden.data_ptr(), cos.data_ptr(), sin.data_ptr(), _ptr(block),
                        self.q4_addresses if q4 else self.addresses, len(self.layers), cache.kv.data_ptr(),
                        KV * cache.capacity * d, scratch.data_ptr(), n, D, H, KV, d, I, past, cache.capacity, lean.eps,
                        threads, weight_kind(Q4_1) if q4 else self.weight_kind, tap_layers, len(taps), _ptr(captured))
        cache.length = past + n
        return hidden, captured


def _addresses(layers: list) -> ctypes.Array:
    """Every layer's tensors' addresses in one array, as lean_layers reads them ([L][9])."""
    return (ctypes.c_void_p * (9 * len(layers)))(*[_ptr(t) for kept in layers for t in kept])


def _flat(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float().contiguous()


def _ptr(t) -> int | None:
    if t is None:
        return None
    return (t.blocks if isinstance(t, PackedWeight) else t).data_ptr()
