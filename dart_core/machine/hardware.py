"""What this machine can do, from torch's own queries: never assumed from one machine's results.

The engine takes a kernel path only where the capability it needs is here (oneDNN's bf16 path needs AVX-512 BW/VL/DQ
or AVX-NE-CONVERT, and raises on an AVX2-only CPU). Tests turn capabilities off (`without`), to check that every
fallback runs and stays lossless, and on (`with_stand_ins`), to run every gated path on any machine: a capability
this machine lacks is then served by a stand-in kernel with the real one's interface (kernels.STAND_IN_OPS).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from functools import lru_cache

import torch

from . import few_rows
from .cpu_info import cpu_flags, cpu_name


@dataclass(frozen=True)
class Hardware:
    device: str = "cpu"          # "cpu" or a CUDA device
    name: str = ""               # the CPU's or GPU's model name
    capability: str = ""         # torch's CPU capability level (DEFAULT, AVX2, AVX512, ...) or the CUDA compute level
    threads: int = 1             # torch's intra-op threads
    onednn: bool = False         # oneDNN kernels on this CPU
    onednn_bf16: bool = False    # oneDNN's bf16 path (native bf16 instructions)
    onednn_fp16: bool = False
    mkl: bool = False            # MKL's packed GEMM (fp32)
    few_rows: bool = False       # our own few-row fp32 kernel, built for this CPU (few_rows.py)
    stand_ins: tuple[str, ...] = ()   # capabilities turned on though this machine lacks them (tests only)
    kind: str = ""               # the CPU kind the kernels see (CPU_KINDS), after any instruction-set limit
    limits: str = ""             # instruction-set limits set in the environment ("ONEDNN_MAX_CPU_ISA=AVX2 ..."), or ""

    @property
    def is_cpu(self) -> bool:
        return self.device.startswith("cpu")

    def describe(self) -> str:
        """One line for a report header: 'AMD EPYC · AVX2 · 2 threads · bf16 kernels: no'."""
        if not self.is_cpu:
            return f"{self.name} · {self.capability}"
        bf16 = "stand-in" if "onednn_bf16" in self.stand_ins else "yes" if self.onednn_bf16 else "no"
        kind = f" · kind {self.kind}" if self.kind else ""
        limited = f" · limited by {self.limits}" if self.limits else ""
        return (f"{self.name or 'unknown CPU'} · {self.capability} · {self.threads} threads · bf16 kernels: {bf16}"
                f"{kind}{limited}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Hardware":
        """As to_dict wrote it, in any version (fields added since take their defaults)."""
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names}
        return cls(**{**known, "stand_ins": tuple(known.get("stand_ins") or ())})

    def without(self, *capabilities: str) -> "Hardware":
        """This machine with some capabilities turned off (for tests and for comparing kernel paths)."""
        return Hardware(**{**asdict(self), **{c: False for c in capabilities},
                           "stand_ins": tuple(c for c in self.stand_ins if c not in capabilities)})

    def with_stand_ins(self, *capabilities: str) -> "Hardware":
        """This machine with some capabilities turned on: those it has stay real, the others are served by
        stand-in kernels (so that every path gated on them runs, on any machine)."""
        missing = tuple(c for c in capabilities if not getattr(self, c))
        return Hardware(**{**asdict(self), **{c: True for c in capabilities},
                           "stand_ins": tuple(dict.fromkeys(self.stand_ins + missing))})


def detect(device: str = "cpu") -> Hardware:
    """The machine the engine runs on now (threads are read at each call: they can be changed at run time)."""
    device = str(device)
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        major, minor = torch.cuda.get_device_capability(index)
        return Hardware(device, torch.cuda.get_device_name(index), f"sm_{major}{minor}", torch.get_num_threads())
    onednn = torch.backends.mkldnn.is_available()
    capability = torch.backends.cpu.get_cpu_capability()
    bf16 = onednn and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    kind = cpu_kind(capability, bf16)
    return Hardware("cpu", cpu_name(), capability, torch.get_num_threads(), onednn, bf16,
                    onednn and bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
                    torch.backends.mkl.is_available(), few_rows.kernel(kind) is not None, kind=kind,
                    limits=isa_limits())


@lru_cache(maxsize=None)
def kernels_here() -> few_rows.FewRowsKernel | None:
    """Our C kernels built for this process's CPU kind, for code with no Hardware at hand (the tree search)."""
    return few_rows.kernel(detect().kind)


# The CPU kinds this project meets, oldest first, and the environment that makes a newer CPU run as each (torch's
# ATen kernels and oneDNN both honour these variables), so that one machine can test the kinds below its own.
CPU_KINDS = {
    "x86-64": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},   # no AVX2: torch's baseline
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},          # e.g. AMD EPYC Zen 3
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"},                           # e.g. Xeon Cascade Lake: bf16 emulated
    "avx512-bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},                      # e.g. AMD EPYC Zen 4
    "amx": {},                                                                        # e.g. Xeon Sapphire Rapids
}
ISA_LIMIT_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
# oneDNN's instruction-set names, oldest first (ONEDNN_MAX_CPU_ISA takes one of them; ALL is no limit)
_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
                "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "ALL")


def isa_limits() -> str:
    """The instruction-set limits set in this process's environment, as 'NAME=VALUE ...' ('' when none)."""
    return " ".join(f"{v}={os.environ[v]}" for v in ISA_LIMIT_VARIABLES if os.environ.get(v))


def _onednn_allows(isa: str) -> bool:
    limit = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    if limit not in _ONEDNN_ISAS:
        return True
    return _ONEDNN_ISAS.index(limit) >= _ONEDNN_ISAS.index(isa)


def cpu_kind(capability: str, onednn_bf16: bool) -> str:
    """Which of CPU_KINDS the kernels see: torch's capability level and oneDNN's bf16 path (both already reflect any
    limit in the environment), native bf16 and AMX from the CPU's flags unless oneDNN is held below them."""
    if capability not in ("AVX2", "AVX512"):
        return "x86-64"
    if capability == "AVX2" or not onednn_bf16:
        return "avx2"
    flags = cpu_flags()
    if "amx_bf16" in flags and _onednn_allows("AVX512_CORE_AMX"):
        return "amx"
    if "avx512_bf16" in flags and _onednn_allows("AVX512_CORE_BF16"):
        return "avx512-bf16"
    return "avx512"


def kinds_below(kind: str) -> list[str]:
    """The CPU kinds older than `kind`, which a machine of that kind can run as (CPU_KINDS' environments)."""
    names = list(CPU_KINDS)
    return names[: names.index(kind)] if kind in names else []
