"""`--dtype auto`: the fastest dtype on this machine, measured rather than assumed.

On a CPU, bf16 halves the bytes every forward reads, but only a CPU with native bf16 instructions (AVX-512 BF16,
AMX) computes it fast; elsewhere torch converts on the fly. On the 2-core AVX2 EPYC the model's decoder linears
took 15 ms in bf16 against 27 ms in fp32 for one row, and 101 against 40 ms for 8 rows: plain decoding would gain,
a DART verify would lose. So the choice times one pass over the model's decoder linears in both dtypes, at one row
(a plain step) and at eight (a verify), each on its fastest kernel here (`kernels.measure_dtypes`, under a second
for SmolLM2-135M, cached per machine), and takes bf16 only where it wins both by BF16_MARGIN. On a GPU, bf16 where
the GPU supports it (its tensor cores), else fp16.

Greedy decoding is lossless in each dtype (DART gives what plain decoding in that dtype gives); bf16 and fp32 are
different computations, so their outputs may differ from each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..hardware import Hardware
from ..kernels import DTYPE_ROWS, decoder_linears, measure_dtypes
from .calibration import cached, model_key

AUTO = "auto"
BF16_MARGIN = 0.9        # bf16 must take at most this share of fp32's time, at every row count measured


@dataclass
class DtypeChoice:
    dtype: str                                 # "fp32", "bf16" or "fp16"
    reason: str                                # one line, for --json, the bench report and the app's header
    seconds: dict[str, list[float]] | None = None   # per dtype, one pass over the decoder linears at DTYPE_ROWS

    def to_dict(self) -> dict:
        return asdict(self)


def decide(seconds: dict[str, list[float]]) -> DtypeChoice:
    """The choice from measured times (`kernels.measure_dtypes`' result)."""
    fp32, bf16 = seconds["float32"], seconds["bfloat16"]
    ratios = [b / f for b, f in zip(bf16, fp32)]
    said = ", ".join(f"{r} row{'s' if r > 1 else ''} {b * 1e3:.1f} vs {f * 1e3:.1f} ms"
                     for r, b, f in zip(DTYPE_ROWS, bf16, fp32))
    if all(r <= BF16_MARGIN for r in ratios):
        return DtypeChoice("bf16", f"bf16: faster than fp32 here (decoder linears, bf16 vs fp32: {said})", seconds)
    return DtypeChoice("fp32", f"fp32: bf16 is not faster here (decoder linears, bf16 vs fp32: {said})", seconds)


def choose_cpu_dtype(model, hardware: Hardware, recalibrate: bool = False) -> DtypeChoice:
    """The dtype for `model` (loaded in fp32) on this CPU, measured once per machine and model shapes."""
    name = model_key(hardware, model, "auto", "dtype")
    return cached(name, recalibrate, lambda: measure_dtypes(decoder_linears(model), hardware),
                  decide, lambda seconds: seconds, "the fastest dtype")


def choose_gpu_dtype(device: str) -> DtypeChoice:
    index = torch.device(device).index or 0
    if torch.cuda.is_bf16_supported():
        return DtypeChoice("bf16", f"bf16: native on {torch.cuda.get_device_name(index)}")
    return DtypeChoice("fp16", f"fp16: {torch.cuda.get_device_name(index)} has no bf16")
