"""What this machine can do, from torch's own queries: never assumed from one machine's results.

The engine takes a kernel path only where the capability it needs is here (oneDNN's bf16 path needs AVX-512 BW/VL/DQ
or AVX-NE-CONVERT, and raises on an AVX2-only CPU). Tests turn capabilities off (`without`), to check that every
fallback runs and stays lossless, and on (`with_stand_ins`), to run every gated path on any machine: a capability
this machine lacks is then served by a stand-in kernel with the real one's interface (kernels.STAND_IN_OPS).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from functools import lru_cache

import torch


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
    stand_ins: tuple[str, ...] = ()   # capabilities turned on though this machine lacks them (tests only)

    @property
    def is_cpu(self) -> bool:
        return self.device.startswith("cpu")

    def describe(self) -> str:
        """One line for a report header: 'AMD EPYC · AVX2 · 2 threads · bf16 kernels: no'."""
        if not self.is_cpu:
            return f"{self.name} · {self.capability}"
        bf16 = "stand-in" if "onednn_bf16" in self.stand_ins else "yes" if self.onednn_bf16 else "no"
        return f"{self.name or 'unknown CPU'} · {self.capability} · {self.threads} threads · bf16 kernels: {bf16}"

    def to_dict(self) -> dict:
        return asdict(self)

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
    return Hardware("cpu", cpu_name(), torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), onednn,
                    onednn and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                    onednn and bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
                    torch.backends.mkl.is_available())


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, platform elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
