"""The draft head's linears in int8, on CPUs whose quantized engine has int8 GEMMs; and the timing of a drafting step
by which the set-up code chooses between them, torch's fp32 and our C layer (dart_core/draft_native.py).

A drafting step reads every weight of the head once for a handful of rows (the K+1 drafted positions, a few
committed ones), so it is bound by memory, above all by the head's output layer. Weights quantized to int8 (torch's
dynamic quantization: int8 weights, activations quantized on the fly) read a quarter of fp32's bytes, so a step can
be much faster for about the same tau (measurements: docs/cpu-speed.md#measured-the-draft-head-in-int8).

The draft only proposes: the target verifies every token exactly, so an int8 head changes which tokens are drafted
and with what probabilities, never what is emitted (greedy or sampled, the acceptance uses the probabilities the
head gave).
"""

from __future__ import annotations

import copy
import time
import warnings
import weakref

import torch

from .draft_head import DraftCache, DraftHead
from .machine.hardware import Hardware
from .machine.kernels import weights_version

# The head's linears that are quantized: all of them (the norms and the mask embedding stay as they are).
LINEARS = ("fc", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
ENGINES = ("x86", "fbgemm", "onednn", "qnnpack")   # torch's quantized engines, preferred first


def int8_supported(hardware: Hardware, head: DraftHead) -> str | None:
    """Why an int8 head cannot run here, or None when it can (a CPU, an fp32 head, a quantized engine)."""
    if not hardware.is_cpu:
        return "int8 draft heads run on CPUs only"
    if head.mask_embed.dtype != torch.float32:
        return f"int8 quantization starts from an fp32 head, this one is {str(head.mask_embed.dtype)[6:]}"
    if not any(e in torch.backends.quantized.supported_engines for e in ENGINES):
        return "this torch build has no quantized engine"
    return None


def int8_copy(head: DraftHead) -> DraftHead:
    """A copy of `head` with its linears in int8 (the head itself is left as it is: training uses it). Made once per
    head and kept while its weights are unchanged: the app builds a drafter for every run."""
    version = weights_version(head)
    known = _COPIES.get(head)
    if known is not None and known[0] == version:
        return known[1]
    out = _quantized(head)
    _COPIES[head] = (version, out)
    return out


_COPIES: "weakref.WeakKeyDictionary[DraftHead, tuple[tuple, DraftHead]]" = weakref.WeakKeyDictionary()


def _quantized(head: DraftHead) -> DraftHead:
    engines = torch.backends.quantized.supported_engines
    torch.backends.quantized.engine = next(e for e in ENGINES if e in engines)
    out = copy.deepcopy(head)
    present = {name for name in LINEARS if isinstance(getattr(out, name, None), torch.nn.Linear)}
    with warnings.catch_warnings():   # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(out, present, dtype=torch.qint8, inplace=True)
    return out.eval()


def head_step(head: DraftHead, out_weight=None, output=None):
    """A drafting step of `head` as torch runs it, and a fresh cache for it: what time_drafting times."""
    return (lambda features, embeds, cache: head(features, embeds, cache, out_weight, output)), DraftCache


def native_step(native):
    """The same through the C layer (a draft_native.NativeDraftHead)."""
    return native.step, native.new_cache


@torch.inference_mode()
def time_drafting(step, new_cache, config, committed: int = 3, context: int = 128, rounds: int = 5,
                  before=None) -> float:
    """Seconds of one drafting step(features, embeds, cache) of a head of `config` (the best of `rounds`):
    `committed` new tokens after `context` cached ones, random inputs (the cost does not depend on the values).
    before: called before each timed step, to leave the caches as decoding leaves them (a target forward has
    streamed its weights through them); None: the head's weights stay cached."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(context + committed, 3 * config.hidden_size, generator=gen)
    embeds = torch.randn(context + committed, config.hidden_size, generator=gen)
    best = float("inf")
    for i in range(rounds + 1):   # the first is a warm-up
        cache = new_cache()
        step(features[:context], embeds[:context], cache)
        if before is not None:
            before()
        t0 = time.perf_counter()
        step(features[context:], embeds[context:], cache)
        if i:
            best = min(best, time.perf_counter() - t0)
    return best
