"""The bench's methods: transformers' two beside the engine's own (dart_core.methods), in one vocabulary."""

from __future__ import annotations

from ...methods import METHODS as ENGINE_METHODS, PLD, VANILLA

HF_GENERATE, HF_PLD = "hf_generate", "hf_pld"
HF_METHODS = (HF_GENERATE, HF_PLD)        # decoded by transformers' `generate`: no Metrics, forwards hook-counted
# Each transformers method just before ours that does the same, then the rest of the engine's methods.
METHODS = (HF_GENERATE, VANILLA, HF_PLD, PLD, *(m for m in ENGINE_METHODS if m not in (VANILLA, PLD)))
PLAIN = (HF_GENERATE, VANILLA)            # reference plain decoding, in order of preference


def is_hf(method: str) -> bool:
    return method in HF_METHODS
