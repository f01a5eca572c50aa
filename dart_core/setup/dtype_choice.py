"""The dtype: `--dtype auto` (the default) is lossless, `--dtype fast` is the fastest measured here.

Lossless means DART's greedy output is token-identical to plain decoding. In bf16 and fp16 it is not, on CPUs and
GPUs alike: a tree verified in one k-token forward rounds differently from k one-token forwards, so many prompts
diverge. So `auto` is fp32 everywhere, with that reason.

`fast` measures. On a CPU, bf16 halves the bytes every forward reads, but only a CPU with native bf16 instructions
(AVX-512 BF16, AMX) computes it fast; elsewhere torch converts on the fly, and bf16 can win at one row (a plain step)
yet lose at eight (a verify). So the choice times one pass over the model's decoder linears in both dtypes, at one
row and at eight, each on its fastest kernel here (`kernels.measure_dtypes`, cached per machine), and takes bf16 only
where it wins both by BF16_MARGIN (measurements: docs/cpu-speed.md#measured-the-dtype-choice). On a GPU, bf16 where
the GPU supports it, else fp16. The bench's default dtype list is fp32, plus bf16 where `fast` takes it.

Where the model decodes through our C layer (dart_core/lean_native.py: a CPU where our kernels build, a family the
lean forward takes), `fast` takes bf16 without measuring torch's linears: the C layer reads bf16 weights, half of
fp32's bytes, widened exactly as they are loaded and computed in fp32 (on the AMX Xeon plain decoding 96 against 52
tokens/s: docs/cpu-speed.md#9-bf16-weights-in-the-c-layer), whatever bf16 instructions the CPU has. It is not the
lossless dtype: bf16 weights give other tokens than fp32's (DART in bf16 is token-identical to plain decoding in bf16).
Except where the model's fp32 weights are Q4_1 blocks (the default model, dequantized from its Q4_1 file): the C layer
reads those blocks, a third of bf16's bytes, with fp32's bits, so `fast` takes fp32 there.

Batched work (training the head, generating its training data) runs many rows per forward, where a CPU without
native bf16 is slowest in bf16: `train` and `train-data` measure at `kernels.BATCH_ROWS` instead
(docs/training.md).
"""

from __future__ import annotations

import torch

from ..lean_native import reads_q4_1_blocks
from ..lean_native import unsupported as native_unsupported
from ..machine.hardware import Hardware
from ..machine.kernels import DTYPE_ROWS, decoder_linears, measure_dtypes
from ..machine.records import DtypeChoice
from .calibration import cached, model_key

AUTO, FAST = "auto", "fast"
LOSSLESS = "fp32"        # the one dtype in which a k-token verify rounds as k one-token forwards do
BF16_MARGIN = 0.9        # bf16 must take at most this share of fp32's time, at every row count measured


def decide(seconds: dict[str, list[float]], rows_measured: tuple[int, ...] = DTYPE_ROWS) -> DtypeChoice:
    """The choice from measured times (`kernels.measure_dtypes`' result at `rows_measured`)."""
    fp32, bf16 = seconds["float32"], seconds["bfloat16"]
    ratios = [b / f for b, f in zip(bf16, fp32)]
    said = ", ".join(f"{r} row{'s' if r > 1 else ''} {b * 1e3:.1f} vs {f * 1e3:.1f} ms"
                     for r, b, f in zip(rows_measured, bf16, fp32))
    detail = f" (decoder linears, bf16 vs fp32: {said})"
    if all(r <= BF16_MARGIN for r in ratios):
        return DtypeChoice.because("bf16", "faster than fp32 here", detail, seconds)
    return DtypeChoice.because("fp32", "bf16 is not faster here", detail, seconds)


def choose_cpu_dtype(model, hardware: Hardware, recalibrate: bool = False,
                     rows_measured: tuple[int, ...] = DTYPE_ROWS, native: bool = True) -> DtypeChoice:
    """The dtype for `model` (loaded in fp32) on this CPU at `rows_measured` (DTYPE_ROWS: decoding; BATCH_ROWS:
    batched work), measured once per machine, model shapes and rows. native: whether the forward asked for would
    run our C layer where it can (not `DART_FORWARD=lean-eager` or `transformers`)."""
    if native and rows_measured == DTYPE_ROWS and reads_q4_1_blocks(model, hardware):
        return DtypeChoice.because("fp32", "our C layer reads this model's fp32 weights as their Q4_1 blocks, "
                                   "fewer bytes than bf16's, and fp32 is lossless",
                                   " (docs/cpu-speed.md#23-the-default-models-weights-read-as-their-q4_1-blocks)")
    if native and rows_measured == DTYPE_ROWS and native_unsupported(model, hardware) is None:
        return DtypeChoice.because("bf16", "our C layer decodes here and reads bf16 weights, half of fp32's bytes",
                                   " (dart_core/lean_native.py: docs/cpu-speed.md#9-bf16-weights-in-the-c-layer)")
    extra = "" if rows_measured == DTYPE_ROWS else f"rows {list(rows_measured)}"
    name = model_key(hardware, model, "auto", "dtype", extra)
    return cached(name, recalibrate,
                  lambda: measure_dtypes(decoder_linears(model), hardware, rows_measured=rows_measured),
                  lambda seconds: decide(seconds, rows_measured), lambda seconds: seconds, "the fastest dtype")


def lossless_choice() -> DtypeChoice:
    return DtypeChoice.because(LOSSLESS, "the dtype in which DART's greedy output is token-identical to plain decoding",
                               " (in bf16 a k-token verify rounds differently from k one-token forwards); --dtype fast "
                               "takes the fastest measured here")


def choose_gpu_dtype(device: str) -> DtypeChoice:
    index = torch.device(device).index or 0
    if torch.cuda.is_bf16_supported():
        return DtypeChoice.because("bf16", f"native on {torch.cuda.get_device_name(index)}")
    return DtypeChoice.because("fp16", f"{torch.cuda.get_device_name(index)} has no bf16")
