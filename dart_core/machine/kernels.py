"""The target's decoder linears through the kernel measured fastest on this machine for the rows at hand.

A verify forward has a few rows (the tree's nodes). On CPUs, torch's default GEMM is slow for 2-16 rows; oneDNN with
the weight packed once is often much faster (measurements: docs/cpu-speed.md#measured-kernels-for-few-rows), and our
own few-row kernel (few_rows.c, fp32, built for the CPU at hand) faster still on the CPUs measured so far.
Which kernel wins depends on the CPU, the shape, the dtype and the threads, so it is measured per machine
(`measure_plan`, a few seconds at the first load) and cached by the set-up code.

The swap lives only inside `FastLinears.active()`, around the engine's own forwards: the transformers model is never
modified, so `model.generate` stays an honest baseline. The price is one packed copy of each swapped weight
(`FastLinears.extra_bytes`).
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from . import few_rows
from .hardware import Hardware
from .records import KernelsInUse

DEFAULT, ONEDNN, FEW_ROWS = "default", "onednn", "few_rows"
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)   # rows measured; a forward of r rows uses the first bucket >= r
PACK_HINT = 8                            # the row count oneDNN packs the weights for


def shape_key(linear: torch.nn.Linear) -> str:
    w = linear.weight
    return f"{w.shape[1]}x{w.shape[0]}{'+b' if linear.bias is not None else ''}:{str(w.dtype).removeprefix('torch.')}"


def by_shape(linears: list[torch.nn.Linear]) -> dict[str, list[torch.nn.Linear]]:
    """The linears grouped by shape_key, in the order they come."""
    groups: dict[str, list[torch.nn.Linear]] = {}
    for m in linears:
        groups.setdefault(shape_key(m), []).append(m)
    return groups


@dataclass(frozen=True)
class PackOps:
    """How a PackedLinear packs a weight once and computes with the packed copy."""
    pack: Callable[[torch.Tensor], torch.Tensor]
    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


ONEDNN_OPS = PackOps(lambda w: torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT),
                     lambda x, w, b: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], ""))
# Where a test turns on a capability this machine lacks (bf16 on an AVX2-only CPU): the same packed copy, caching
# and version tracking around a kernel that runs anywhere, so every path gated on the capability is exercised.
STAND_IN_OPS = PackOps(lambda w: w.clone(), F.linear)
# The few-row kernel's stand-in packs the weights as the real one does and computes from that layout in torch.
FEW_ROWS_STAND_IN = PackOps(lambda w: few_rows.pack(w, 16), few_rows.stand_in_linear)


def pack_ops(hardware: Hardware, dtype: torch.dtype, kernel: str = ONEDNN) -> PackOps:
    """`kernel`'s packing and product, or its stand-in where the capability it needs is one of
    `hardware.stand_ins`."""
    if kernel == FEW_ROWS:
        built = None if "few_rows" in hardware.stand_ins else few_rows.kernel(hardware.kind)
        return PackOps(built.pack, built.linear) if built is not None else FEW_ROWS_STAND_IN
    needs = "onednn_bf16" if dtype == torch.bfloat16 else "onednn"
    return STAND_IN_OPS if needs in hardware.stand_ins or "onednn" in hardware.stand_ins else ONEDNN_OPS


def available_kernels(hardware: Hardware, dtype: torch.dtype) -> list[str]:
    """The kernels this machine can run for `dtype`: default always; oneDNN on a CPU that has its path; the few-row
    kernel in fp32 on a CPU where it was built."""
    kernels = [DEFAULT]
    if hardware.is_cpu and hardware.onednn and (dtype == torch.float32 or (dtype == torch.bfloat16 and
                                                                           hardware.onednn_bf16)):
        kernels.append(ONEDNN)
    if hardware.is_cpu and hardware.few_rows and dtype == torch.float32:
        kernels.append(FEW_ROWS)
    return kernels


@dataclass
class KernelPlan:
    """The kernel chosen for each linear shape at each row bucket, and the timings (us) it was chosen from."""
    choices: dict[str, list[str]] = field(default_factory=dict)
    timings: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    buckets: tuple[int, ...] = ROW_BUCKETS

    def kernel_for(self, key: str, rows: int) -> str:
        chosen = self.choices.get(key)
        if not chosen or rows > self.buckets[-1]:
            return DEFAULT      # a prefill: many rows, measured by nobody, served well by the default GEMM
        return chosen[next(i for i, b in enumerate(self.buckets) if rows <= b)]

    def to_dict(self) -> dict:
        return {**asdict(self), "buckets": list(self.buckets)}

    @classmethod
    def from_dict(cls, d: dict) -> "KernelPlan":
        return cls({k: list(v) for k, v in d["choices"].items()}, d.get("timings", {}), tuple(d["buckets"]))


class PackedLinear:
    """One linear computed by a packed kernel (oneDNN's, or our few-row one) from a copy of its weight packed once
    (packed again if the weight changes).

    For few rows these beat torch's default GEMM and `torch.utils.mkldnn.MkldnnLinear` alike, which is why the output
    layers use them too (measurements: docs/cpu-speed.md#measured-kernels-for-few-rows). The price is the packed copy
    in memory."""

    def __init__(self, linear: torch.nn.Linear, ops: PackOps = ONEDNN_OPS):
        self.linear, self.ops = linear, ops
        self._pack()

    def _pack(self) -> None:
        w = self.linear.weight
        self.weight = self.ops.pack(w.detach())
        self.bias = None if self.linear.bias is None else self.linear.bias.detach().contiguous()
        self.version = weight_version(w)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if weight_version(self.linear.weight) != self.version:   # the weights were changed or moved: pack again
            self._pack()
        flat = x.reshape(-1, x.shape[-1])
        y = self.ops.linear(flat, self.weight, self.bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def weight_version(w: torch.Tensor) -> tuple[int, int | None]:
    """Where a weight lives and how often it was changed in place. A weight made under torch.inference_mode (a copy
    made to measure, a model loaded by a user inside it) has no version counter; it cannot be changed in place
    outside inference mode, so its storage alone tells."""
    return w.data_ptr(), None if w.is_inference() else w._version


def weights_version(module: torch.nn.Module) -> tuple:
    """weight_version of every parameter of `module`: it moves when any of them is changed in place or moved (what a
    packed copy of the weights is kept against)."""
    return tuple(weight_version(p) for p in module.parameters())


def onednn_applies(layer, hardware: Hardware) -> bool:
    """Whether a PackedLinear can stand in for this layer: a Linear on CPU in fp32, or in bf16 where this CPU's
    oneDNN has a bf16 path (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; on an AVX2-only CPU it raises instead)."""
    if not (isinstance(layer, torch.nn.Linear) and layer.weight.device.type == "cpu" and hardware.onednn):
        return False
    if layer.weight.dtype == torch.bfloat16:
        return hardware.onednn_bf16
    return layer.weight.dtype == torch.float32


def packed_linear(layer: torch.nn.Linear, hardware: Hardware, kernel: str = ONEDNN) -> PackedLinear:
    """`layer` on `kernel`'s packed weight (or its stand-in, where `hardware` says so); see `onednn_applies`."""
    return PackedLinear(layer, pack_ops(hardware, layer.weight.dtype, kernel))


@torch.inference_mode()
def measure_plan(linears: list[torch.nn.Linear], hardware: Hardware, rounds: int = 2) -> KernelPlan:
    """Time every available kernel on every distinct shape at every row bucket and keep the fastest. Each timing
    runs over all the model's linears of that shape, with their own weights, as a forward does: one weight alone
    would stay in the cache and favour the wrong kernel. A kernel whose output differs from the default's is never
    chosen."""
    plan = KernelPlan()
    for key, group in by_shape(linears).items():
        first = group[0]
        kernels = available_kernels(hardware, first.weight.dtype)
        if len(kernels) == 1:
            continue
        fns = {DEFAULT: [lambda x, m=m: F.linear(x, m.weight, m.bias) for m in group]}
        for kernel in kernels[1:]:
            fns[kernel] = [packed_linear(m, hardware, kernel) for m in group]
        times: dict[str, list[float]] = {k: [] for k in fns}
        for rows in plan.buckets:
            x = torch.randn(rows, first.in_features, dtype=first.weight.dtype, device=first.weight.device)
            ref = fns[DEFAULT][0](x)
            for name, layer_fns in fns.items():
                same = name == DEFAULT or torch.allclose(layer_fns[0](x).float(), ref.float(), rtol=1e-2, atol=1e-3)
                times[name].append(_best_time(layer_fns, x, rounds) * 1e6 if same else float("inf"))
        plan.timings[key] = {k: [round(t, 2) for t in v] for k, v in times.items()}
        plan.choices[key] = [min(times, key=lambda k: times[k][i]) for i in range(len(plan.buckets))]
    return plan


def _best_time(fns, x, rounds: int) -> float:
    """Seconds of one pass over `fns` (one call each), the best of `rounds` after a warm-up pass."""
    best = float("inf")
    for i in range(rounds + 1):
        t0 = time.perf_counter()
        for fn in fns:
            fn(x)
        if i:
            best = min(best, time.perf_counter() - t0)
    return best


DTYPE_ROWS = (1, 8)      # the rows of a plain step and of a typical verify, where dtypes are compared
BATCH_ROWS = (32, 256)   # batched work: a generation step over 32 prompts, a training sequence's forward
MAX_PER_SHAPE = 16       # linears timed per shape when comparing dtypes: past the caches, and quick


@torch.inference_mode()
def measure_dtypes(linears: list[torch.nn.Linear], hardware: Hardware, dtypes=(torch.float32, torch.bfloat16),
                   rounds: int = 2, rows_measured: tuple[int, ...] = DTYPE_ROWS) -> dict[str, list[float]]:
    """Seconds of one pass over the linears (as a forward makes it) at each of `rows_measured`, per dtype, each
    shape on the fastest kernel this machine has for it in that dtype. Timed on copies of up to MAX_PER_SHAPE
    weights per shape (scaled to all of them), so the model itself is not touched."""
    groups = by_shape(linears)
    out = {}
    for dtype in dtypes:
        total = [0.0] * len(rows_measured)
        for group in groups.values():
            sample = [_copy_as(m, dtype) for m in group[:MAX_PER_SHAPE]]
            fns = [[lambda x, m=m: F.linear(x, m.weight, m.bias) for m in sample]]
            fns += [[packed_linear(m, hardware, kernel) for m in sample]
                    for kernel in available_kernels(hardware, dtype)[1:]]
            for j, rows in enumerate(rows_measured):
                x = torch.randn(rows, sample[0].in_features, dtype=dtype, device=sample[0].weight.device)
                total[j] += len(group) / len(sample) * min(_best_time(f, x, rounds) for f in fns)
        out[str(dtype).removeprefix("torch.")] = total
    return out


def _copy_as(linear: torch.nn.Linear, dtype: torch.dtype) -> torch.nn.Linear:
    if linear.weight.dtype == dtype:
        return linear
    copy = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, dtype=dtype,
                           device=linear.weight.device)
    copy.weight.data = linear.weight.detach().to(dtype)
    if linear.bias is not None:
        copy.bias.data = linear.bias.detach().to(dtype)
    return copy


class FastLinears:
    """The target's linears, each computed by its plan's kernel for the rows of the forward, inside `active()`."""

    def __init__(self, linears: list[torch.nn.Linear], plan: KernelPlan, hardware: Hardware):
        self.plan = plan
        self.linears = [m for m in linears if self.plan.choices.get(shape_key(m))]
        # each linear's packed copies, one per kernel its plan chooses at some row count
        self.packed = {id(m): {k: packed_linear(m, hardware, k) for k in dict.fromkeys(plan.choices[shape_key(m)])
                               if k != DEFAULT} for m in self.linears}
        # built once: entering `active()` for every forward only assigns them (building them there cost a visible
        # share of a verify; measurements: docs/cpu-speed.md#measured-kernels-for-few-rows)
        self._forwards = [(m, types.MethodType(self._forward(m), m)) for m in self.linears]

    @property
    def extra_bytes(self) -> int:
        """Memory of the packed copies (the original weights stay for transformers' own forwards)."""
        return sum(m.weight.numel() * m.weight.element_size() * len(self.packed[id(m)]) for m in self.linears)

    def summary(self) -> KernelsInUse:
        """Which kernel each shape uses per row bucket, and the memory of the packed copies."""
        return KernelsInUse(tuple(self.plan.buckets), {k: list(v) for k, v in self.plan.choices.items()},
                            round(self.extra_bytes / 2**20, 1))

    @contextmanager
    def active(self):
        for m, forward in self._forwards:
            m.forward = forward
        try:
            yield
        finally:
            for m, _ in self._forwards:
                del m.forward   # back to nn.Linear.forward

    def _forward(self, linear: torch.nn.Linear):
        key, packed, plan = shape_key(linear), self.packed[id(linear)], self.plan
        by_rows: dict[int, PackedLinear | None] = {}   # the plan's kernel per row count, looked up once

        def forward(module, x):
            rows = x.numel() // x.shape[-1]
            if rows not in by_rows:
                by_rows[rows] = packed.get(plan.kernel_for(key, rows))
            kernel = by_rows[rows]
            return kernel(x) if kernel is not None else F.linear(x, module.weight, module.bias)
        return forward


def decoder_linears(model) -> list[torch.nn.Linear]:
    """Every nn.Linear inside the decoder layers (the output layer is added by `TargetModel.planned_linears`)."""
    return [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
