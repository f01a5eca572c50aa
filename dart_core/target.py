"""The target model: prefill, tree verification in one forward, feature taps, and KV cache rollback / compaction.

Works on unmodified transformers causal LMs whose decoder layers live in `model.model.layers` (Llama, Qwen2,
Qwen3, Mistral, ...). The tree mask is passed per call as a 4D boolean mask; nothing is left on the model.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext

import torch
from transformers import DynamicCache

from .acceptance import greedy_ids
from .machine.hardware import Hardware, detect
from .machine.kernels import FastLinears, KernelPlan, decoder_linears, onednn_applies, weights_version
from .lean_forward import OFF, LeanForward, StaticKV
from .lean_native import Q4_1_ROWS, NativeLayers
from .lean_native import unsupported as native_unsupported
from .machine import few_rows
from .machine.few_rows import Reading
from .machine.records import DtypeChoice
from .tree import TokenTree


def cache_argument(model) -> str:
    """The keyword a transformers model's forward takes its KV cache by: `cache` from transformers 5.2x (the pinned
    version), `past_key_values` before (5.17 on some GPU machines' images), where an unknown `cache=` is
    swallowed by **kwargs and the forward silently runs without a cache."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def tap_layer_indices(num_layers: int) -> tuple[int, int, int]:
    """EAGLE3 / DART feature taps: the inputs of layers 2, N//2 and N-3 (low, mid, high)."""
    return (min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0))


class TargetModel:
    def __init__(self, model, tokenizer=None, hardware: Hardware | None = None):
        """hardware: what the kernels may use (default: what this machine has; tests turn capabilities on and off)."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        try:
            self.layers = model.model.layers
            self.embed_tokens = model.get_input_embeddings()
            self.lm_head = model.get_output_embeddings()
        except AttributeError as exc:
            raise TypeError(f"{type(model).__name__} is not a decoder-only model with model.layers") from exc
        self.num_layers = len(self.layers)
        self.taps = tap_layer_indices(self.num_layers)
        self.hidden_size = int(self.config.hidden_size)
        self.vocab_size = int(self.lm_head.weight.shape[0])
        self.max_positions = int(getattr(self.config, "max_position_embeddings", 0) or 1 << 30)
        self.hardware = hardware or detect(str(self.device))
        self.dtype_choice: DtypeChoice | None = None   # set where the dtype was chosen (--dtype auto or fast)
        self.cache_kwarg = cache_argument(model)
        self.own_output_layer = _logits_are_output_layer(self)
        self.fast_linears: FastLinears | None = None
        self.lean: LeanForward | None = None
        self.greedy_copy_rows: int | None = None   # measured: greedy steps of up to these rows read the output copy
        self._copy_tile_rows: int | None = 1        # ... and from these rows on its integer product (AMX or VNNI)
        self._reading = Reading()                   # measured: how the C layer's products read the weights
        self._prefill_rows: int | None = 0          # measured: prompts the C layer prefills (lean_native.py)
        self._q4_1_rows: int | None = None          # measured: steps that read Q4_1 blocks (None: the default)

    def use_lean(self, on: bool = True, graphs: bool = True, tiles: str | None = None) -> str | None:
        """Decode through the lean forward over a static cache (dart_core.lean_forward) where this model's family
        allows it; off: transformers' forward. graphs: its steps captured as CUDA graphs on a GPU, and on a CPU in fp32
        its decode and verify steps in our C layer where it was built (dart_core.lean_native); False: torch's
        operations, eagerly. tiles: in the C layer, how a bf16 model's products run (lean_native.NativeLayers).
        Returns why it is off (None when on). Call before `use_kernels`: the plan chooses kernels for the lean
        forward's fused projections (none where the C layer computes them)."""
        why = LeanForward.unsupported(self.model) if on else "off by request"
        self.lean = LeanForward(self.model, self.taps) if why is None else None
        self._lean_made = (weights_version(self.model), graphs, tiles)
        if self.lean is not None and not graphs:
            self.lean.graphs = OFF
        if self.lean is not None and graphs and native_unsupported(self.model, self.hardware) is None:
            kernel = few_rows.kernel(self.hardware.kind)
            self.lean.native = NativeLayers(self.lean, kernel, tiles) if kernel is not None else None
            self.use_greedy_copy(self.greedy_copy_rows, self._copy_tile_rows)
            self.use_reading(self._reading)
            self.use_prefill(self._prefill_rows)
            self.use_q4_1(self._q4_1_rows)
        return why

    def use_greedy_copy(self, rows: int | None, tile_rows: int | None = 1) -> None:
        """Greedy steps of up to `rows` rows choose from the output layer's copy (dart_core.greedy_output), larger ones
        from the full layer; None: every step the C layer serves. Where the copy has an integer product (on AMX tiles
        or by VNNI), steps of at least `tile_rows` rows take it (None: none). Both as measured: setup.calibration."""
        self.greedy_copy_rows, self._copy_tile_rows = rows, tile_rows
        native = self._native
        if native is not None and native.greedy is not None:
            native.greedy_rows = native.max_rows if rows is None else min(rows, native.max_rows)
            native.greedy.tile_rows = tile_rows

    def use_reading(self, reading: Reading) -> None:
        """How the C layer's products read their weights (machine.few_rows.Reading: prefetching ahead or not). As
        measured: setup.calibration.reading_choice."""
        self._reading = reading
        if self._native is not None:
            self._native.reading = reading

    def use_q4_1(self, rows: int | None) -> None:
        """Steps of up to `rows` rows read the weights as Q4_1 blocks where the model's are such (None: up to
        lean_native.Q4_1_ROWS; 0: never). As measured: setup.calibration.q4_1_choice."""
        self._q4_1_rows = rows
        native = self._native
        if native is not None and native.q4_layers is not None:
            native.q4_rows = Q4_1_ROWS if rows is None else min(rows, native.max_rows)

    @property
    def q4_1_rows(self) -> int:
        """Up to how many rows a step reads the weights as Q4_1 blocks (0: never, or no such weights)."""
        native = self._native
        return native.q4_rows if native is not None else 0

    def use_prefill(self, rows: int | None) -> None:
        """Prompts of up to `rows` tokens (None: any; 0: none longer than its rows) run through the C layer, its rows
        at a time; longer ones through the lean forward's torch step. As measured: setup.calibration.prefill_choice."""
        self._prefill_rows = rows
        if self._native is not None:
            self._native.prefill_rows = None if rows is None else max(rows, self._native.max_rows)

    @property
    def prefill_reach(self) -> str:
        """The prompts longer than its rows that the C layer prefills, in words: "any length", "up to N tokens", or ""
        (none, or no C layer)."""
        native = self._native
        if native is None or (native.prefill_rows is not None and native.prefill_rows <= native.max_rows):
            return ""
        return "any length" if native.prefill_rows is None else f"up to {native.prefill_rows} tokens"

    @property
    def reading(self) -> Reading | None:
        """How the C layer's products read their weights; None: no C layer."""
        return self._native.reading if self._native is not None else None

    @property
    def _native(self):
        """The C layer our lean forward steps through (dart_core.lean_native.NativeLayers), or None."""
        return self.lean.native if self.lean is not None else None

    @property
    def huge_pages(self) -> bool | None:
        """Whether the C layer's weights are on huge pages (dart_core.machine.huge_pages); None: no C layer."""
        native = self._native
        return native.huge_pages if native is not None else None

    @property
    def bf16_tiles(self) -> str:
        """How the C layer computes this bf16 model's products from tiles: "amx", "avx512-bf16", "stand-in", or ""
        (not from tiles; dart_core.lean_native)."""
        native = self._native
        return native.tiles if native is not None else ""

    @property
    def greedy_copy_tile_rows(self) -> int | None:
        """The rows from which the output layer's copy computes its integer product (None: it does not)."""
        return self._greedy_copy.tile_rows if self.greedy_copy_tiles else None

    @property
    def greedy_copy_tiles(self) -> str:
        """How the output layer's copy computes its integer product: "amx" (on AMX tiles), "vnni", or "" (no way)."""
        copy = self._greedy_copy
        return copy.tiles_mode if copy is not None and copy.tiles_mode in ("amx", "vnni") else ""

    @property
    def _greedy_copy(self):
        native = self._native
        return native.greedy if native is not None else None

    @property
    def forward_kind(self) -> str:
        """Which forward decodes: 'lean-native' (ours, its steps in our C layer), 'lean' (ours, torch's operations)
        or 'transformers'."""
        if self.lean is None:
            return "transformers"
        return "lean-native" if self.lean.native is not None else "lean"

    def use_kernels(self, plan: KernelPlan | None) -> None:
        """Compute the linears of our own forwards with `plan`'s kernels (None: torch's default)."""
        self.fast_linears = FastLinears(self.planned_linears(), plan, self.hardware) if plan is not None else None

    def planned_linears(self) -> list[torch.nn.Linear]:
        """The linears a kernel plan chooses for: the decoder's, and the output layer where our forwards apply it
        themselves (its packed kernel wins from 4 rows but loses at 1-2 on some CPUs; docs/cpu-speed.md)."""
        if self.lean is not None:
            return [] if self.lean.native is not None else self.lean.linears()
        return decoder_linears(self.model) + ([self.lm_head] if self.own_output_layer else [])

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def new_cache(self, capacity: int = 256) -> DynamicCache | StaticKV:
        """An empty KV cache for one decode: static (allocated once for `capacity` tokens, grown if a run outlives
        it) under the lean forward, transformers' DynamicCache otherwise."""
        if self.lean is not None:
            self._refresh_lean()
            return self.lean.new_cache(capacity)
        return DynamicCache(config=self.config)

    def _refresh_lean(self) -> None:
        """The lean forward decodes from copies of the weights (fused projections, the C layer's packing): where the
        model's weights changed in place since they were made, they are made again before the next decode."""
        versions, graphs, tiles = self._lean_made
        if weights_version(self.model) != versions:
            plan = self.fast_linears.plan if self.fast_linears is not None else None
            self.use_lean(True, graphs, tiles)
            self.use_kernels(plan)

    def release(self, cache: DynamicCache | StaticKV) -> None:
        """The decode that used `cache` is over (a static cache is kept for the next one)."""
        if isinstance(cache, StaticKV) and self.lean is not None:
            self.lean.release(cache)

    # ------------------------------------------------------------------ forwards
    @contextmanager
    def _feature_taps(self, enabled: bool):
        """Collect the inputs of the tap layers during one forward (hooks live only inside the block)."""
        captured: dict[int, torch.Tensor] = {}
        handles = []
        if enabled:
            for idx in sorted(set(self.taps)):
                def hook(module, args, kwargs, idx=idx):
                    captured[idx] = args[0] if args else kwargs["hidden_states"]
                handles.append(self.layers[idx].register_forward_pre_hook(hook, with_kwargs=True))
        try:
            yield captured
        finally:
            for h in handles:
                h.remove()

    def _logits_and_features(self, inputs: dict, features: bool, last_only: bool = False):
        """One forward of the model under the kernel plan: logits [B, T or 1, V], features [B, T, 3H] or None."""
        fast = self.fast_linears.active() if self.fast_linears is not None else nullcontext()
        with self._feature_taps(features) as captured, fast:
            if self.own_output_layer:   # inside `fast`: the plan's kernel for this many rows
                hidden = self.model.model(**inputs).last_hidden_state
                logits = self.lm_head(hidden[:, -1:] if last_only else hidden)
            else:
                logits = self.model(**inputs, logits_to_keep=1 if last_only else 0).logits
        feats = torch.cat([captured[i] for i in self.taps], dim=-1) if features else None
        return logits, feats

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor, cache: DynamicCache,
                attention_mask: torch.Tensor | None = None, features: bool = False,
                last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids, position_ids: [k]. Returns logits [k or 1, V] and features [k, 3H] (or None)."""
        if isinstance(cache, StaticKV):   # the lean forward takes the block's own [k, k] mask (None: causal)
            block = attention_mask[0, 0, :, -ids.shape[0]:] if attention_mask is not None else None
            return self._lean_forward(ids, position_ids, cache, block, features, last_only)
        ids, position_ids = ids.to(self.device, non_blocking=True), position_ids.to(self.device, non_blocking=True)
        inputs = {"input_ids": ids[None], "position_ids": position_ids[None], "attention_mask": attention_mask,
                  self.cache_kwarg: cache, "use_cache": True}
        logits, feats = self._logits_and_features(inputs, features, last_only)
        return logits[0], feats[0] if feats is not None else None

    @torch.inference_mode()
    def forward_padded(self, ids: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Several whole sequences in one forward, without a cache (training's features and labels: on a GPU one
        forward per sequence leaves it idle on Python). ids: [B, T], sequence b's tokens first, then padding.
        Returns logits [B, T, V] and features [B, T, 3H]; rows past a sequence's length are padding's."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        mask = None if min(lengths) == ids.shape[1] else \
            (positions[None] < torch.tensor(lengths, device=ids.device)[:, None]).long()
        return self._logits_and_features({"input_ids": ids, "attention_mask": mask, "use_cache": False}, True)

    def prefill(self, prompt_ids: list[int], cache: DynamicCache, features: bool = False):
        """Run the prompt. Returns (last-position logits [V], prompt features [L, 3H] or None)."""
        ids = torch.tensor(prompt_ids, dtype=torch.long)   # on the host: each forward copies what it needs
        logits, feats = self.forward(ids, torch.arange(len(prompt_ids)), cache, features=features, last_only=True)
        return logits[-1], feats

    def verify(self, tree: TokenTree, cache: DynamicCache | StaticKV, features: bool = False, choices: bool = False):
        """Score every tree node in one forward. Node i sees the whole cache plus its own ancestors.

        Returns logits [n, V] (row i predicts the token after node i) and features [n, 3H] (or None). With
        `choices`, the target's greedy choice at each node [n] instead of its logits: all greedy decoding needs, and
        where our C layer runs, found without computing every logit (dart_core.greedy_output).
        The n new KV entries are appended to the cache; `commit` keeps only the accepted ones.
        """
        past = cache.get_seq_length()
        n = len(tree)
        ids = torch.tensor(tree.tokens, dtype=torch.long)   # on the host: each forward copies what it needs
        pos = torch.tensor(tree.depths, dtype=torch.long) + past
        chain = tree.parents == list(range(-1, n - 1))
        if isinstance(cache, StaticKV):
            return self._lean_forward(ids, pos, cache, None if chain else tree.ancestor_mask(), features,
                                      choices=choices)
        if chain:
            mask = None  # a chain (plain decoding, prompt lookup): the model's own causal mask is the tree mask
        else:
            mask = torch.ones(n, past + n, dtype=torch.bool, device=self.device)
            mask[:, past:] = tree.ancestor_mask(self.device)
            mask = mask[None, None]
        logits, feats = self.forward(ids, pos, cache, attention_mask=mask, features=features)
        return (greedy_ids(logits) if choices else logits), feats

    @torch.inference_mode()
    def _lean_forward(self, ids, positions, cache: StaticKV, block_mask, features: bool, last_only: bool = False,
                      choices: bool = False):
        fast = self.fast_linears.active() if self.fast_linears is not None else nullcontext()
        with fast:
            return self.lean.forward(ids, positions, cache, block_mask, self.taps if features else (), last_only,
                                     choices)

    # ------------------------------------------------------------------ cache edits
    @staticmethod
    def rollback(cache: DynamicCache | StaticKV, length: int) -> None:
        """Drop every cache entry past `length`."""
        if isinstance(cache, StaticKV):
            cache.rollback(length)
            return
        extra = cache.get_seq_length() - length
        if extra < 0:
            raise ValueError(f"cannot roll back a cache of {length + extra} entries to {length}")
        if extra:
            cache.crop(-extra)

    @staticmethod
    def commit(cache: DynamicCache | StaticKV, past: int, kept_nodes: list[int]) -> None:
        """After a verify pass at offset `past`, keep only the tree nodes `kept_nodes` (in order) after `past`."""
        if kept_nodes == list(range(len(kept_nodes))):  # a prefix of the nodes: a plain crop is enough
            TargetModel.rollback(cache, past + len(kept_nodes))
            return
        if isinstance(cache, StaticKV):
            cache.keep(past, list(kept_nodes))
            return
        n_total = cache.get_seq_length()
        keep = torch.tensor([past + i for i in kept_nodes], dtype=torch.long)
        if int(keep.max()) >= n_total:
            raise ValueError("kept node outside the verified block")
        on_device = {}   # one copy of the indices per device, not one per layer
        for layer in cache.layers:
            idx = on_device.get(layer.keys.device)
            if idx is None:
                idx = on_device[layer.keys.device] = keep.to(layer.keys.device)
            layer.keys = torch.cat([layer.keys[..., :past, :], layer.keys.index_select(-2, idx)], dim=-2)
            layer.values = torch.cat([layer.values[..., :past, :], layer.values.index_select(-2, idx)], dim=-2)


@torch.inference_mode()
def _logits_are_output_layer(target: TargetModel) -> bool:
    """Whether our forwards may apply the output layer themselves, so that the kernel plan chooses its kernel too:
    where a packed kernel could apply (CPU, fp32 or bf16) and the model's logits are exactly its output layer on the
    last hidden state (checked once on two tokens: no soft-capping or scaling). The transformers model itself is left
    untouched, so `model.generate` runs as shipped."""
    head = target.lm_head
    if not onednn_applies(head, target.hardware) or not hasattr(target.model, "model"):
        return False
    try:
        ids = torch.tensor([[0, 1]], dtype=torch.long, device=target.device)
        hidden = target.model.model(input_ids=ids).last_hidden_state[0]
        logits = target.model(input_ids=ids).logits[0]
        return torch.allclose(head(hidden).float(), logits.float(), rtol=1e-2, atol=1e-2)
    except (RuntimeError, TypeError, AttributeError):
        return False
