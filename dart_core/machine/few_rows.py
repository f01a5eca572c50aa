"""Our own fp32 kernels for few rows, built for the CPU at hand with its C compiler: few_rows.c (a linear, on fp32 or
bf16 weights) and lean_layer.c (a whole decoder layer on it, which dart_core/lean_native.py drives for the target and
dart_core/draft_native.py for the draft head); with them int8_tiles.c, the output copy's integer product (on AMX
tiles or by VNNI), and bf16_tiles.c, a bf16 model's products from tiles (on AMX or by AVX512-BF16; both packed by
amx_tiles.py), and tree_search.c, DART's tree search and its n-gram counts.

A decode step computes each linear for 1 row, a verify for a handful; both read every weight once, so the kernel that
keeps memory busy wins. torch's GEMMs leave much of it unused at 2-16 rows (docs/cpu-speed.md, section 7). The C
sources are compiled once per CPU (cached under cache_root()/kernels, named by the sources, the flags and the CPU)
and called through ctypes, on a packed copy of each weight. Where no compiler works, the machine simply lacks the
capability (`Hardware.few_rows`): the kernel plan never offers the kernel, the lean forward runs torch's operations,
and tests run the same packing with a stand-in kernel.

The library is linked against OpenMP and loaded after torch, so it shares torch's OpenMP runtime (libgomp.so.1 is
resolved to the copy torch loaded) instead of starting a second pool of threads on the same cores.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from . import huge_pages
from .cpu_info import cpu_flags, cpu_name
from .paths import cache_root

# the few-row linear, the products from tiles, the decoder layer built on them (dart_core/lean_native.py,
# draft_native.py), the tree search; and the header the tiles' two share
SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("few_rows.c", "int8_tiles.c", "bf16_tiles.c", "lean_layer.c", "tree_search.c"))
HEADERS = (Path(__file__).with_name("tiles.h"),)
BUILD_SECONDS = 120
# The instruction set the build targets, by CPU kind (hardware.CPU_KINDS): a process held to an older kind gets that
# kind's code, as torch's own kernels do; the machine's own kind gets everything its CPU has.
MARCH = {"x86-64": "-march=x86-64", "avx2": "-march=x86-64-v3",
         # not kinds of hardware.CPU_KINDS: the build an AVX2 CPU with AVX-VNNI gets (Intel's client cores since Alder
         # Lake), and the same loop with the instruction written out, for the tests and studies (int8_tiles.c's 256-bit
         # VNNI); a CPU without AVX-VNNI asked for the first gets the second
         "avx2-vnni": "-march=x86-64-v3 -mavxvnni", "avx2-vnni-stand-in": "-march=x86-64-v3 -DVNNI_256_STAND_IN",
         # and the AVX2 build passing more than 8 rows 8 at a time, as 32 registers do (AVX-512), for the tests
         "avx2-passes-of-8": "-march=x86-64-v3 -DSHARED_ROWS=8"}
# What a build needs of the machine beyond our sources: where this fails too, the toolchain is what is missing.
PROBE = "#include <math.h>\n#include <string.h>\nfloat probe(float x) { return sqrtf(x) + (float)strlen(\"\"); }\n"
NO_TOOLCHAIN = "the C compiler here cannot build a shared library"
UNWRITABLE = "cannot write the kernels' cache folder"


# fp32 weights that are Q4_1 blocks (few_rows.c: few_rows_q4_1_pack), packed as such (bytes), read back exactly
Q4_1 = torch.uint8
Q4_RUN = 32   # inputs a Q4_1 block covers
# The weights `pack` packs, and the code by which lean_layer.c is told which (its FP32/BF16/INT8_WEIGHTS); fp32 weights
# packed as Q4_1 blocks are its Q4_1_WEIGHTS, bf16 weights packed as tiles (amx_tiles.py) its BF16_TILES plus their
# way's code less one.
WEIGHT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}
Q4_1_KIND = 3
BF16_TILES = 4
# The ways products on bf16 tiles run (bf16_tiles.c's codes): on AMX (where usable, else the stand-in), by the plain-C
# stand-in, or by AVX512-BF16's VDPBF16PS (its arithmetic written out where the build has none).
BF16_WAYS = {"amx": 1, "stand-in": 2, "avx512-bf16": 3}


def weight_kind(weights: torch.dtype, tiles: str = "") -> int:
    """What lean_layer.c is told of weights in `weights` (Q4_1: fp32 ones packed as Q4_1 blocks), or (`tiles`, a way
    of BF16_WAYS) of bf16 ones on tiles."""
    if tiles:
        return BF16_TILES + BF16_WAYS[tiles] - 1
    return Q4_1_KIND if weights == Q4_1 else WEIGHT_KINDS[weights]


@dataclass(frozen=True)
class Reading:
    """How the products read their weights (few_rows.c, few_rows_reading): one-pass products (up to 8 rows) of fewer
    than `prefetch_from` rows leave prefetching to the hardware (1: all prefetch ahead). The same bits either way;
    which is faster is measured (setup/calibration.py: reading_choice)."""
    prefetch_from: int = 1

    def apply(self, kernel: "FewRowsKernel") -> None:
        kernel.lib.few_rows_reading(self.prefetch_from)


@dataclass(frozen=True)
class PackedWeight:
    """A weight [N, K] packed as [ceil(N / width), K, width] (zeros past N) in fp32, bf16 or int8, and its N; int8
    weights have a scale per output (`scales`, ceil(N / width) * width floats), stored right after the blocks, where
    the kernel reads them. `tiles`: bf16 weights packed instead as tiles (amx_tiles.bf16_tiles), and the way their
    products run (one of BF16_WAYS); "" for weights packed for few_rows.c."""
    blocks: torch.Tensor
    out_features: int
    scales: torch.Tensor | None = None
    tiles: str = ""

    @property
    def kind(self) -> int:
        return weight_kind(self.blocks.dtype, self.tiles)

    def takes(self, k: int) -> bool:
        """Whether its inputs are k long."""
        if self.tiles or self.blocks.dtype == Q4_1:   # (tiles and blocks of 32 inputs)
            return -(-k // 32) == self.blocks.shape[1] and (bool(self.tiles) or k % Q4_RUN == 0)
        return self.blocks.shape[1] == k


def pack(weight: torch.Tensor, width: int, dtype: torch.dtype = torch.float32) -> PackedWeight:
    """`weight` packed for the kernel: in fp32, rounded to bf16, or in int8 with a scale per output (its largest
    weight maps to 127)."""
    if dtype not in WEIGHT_KINDS:
        raise ValueError(f"the few-row kernel reads fp32, bf16 or int8 weights, not {dtype}")
    n, k = weight.shape
    padded = -(-n // width) * width
    w = torch.zeros(padded, k)
    w[:n] = weight.detach().float()
    if dtype != torch.int8:
        return PackedWeight(huge_pages.copy_of(w.to(dtype).view(padded // width, width, k).transpose(1, 2)), n)
    scale = w.abs().amax(dim=1) / 127
    scale[scale == 0] = 1.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    buffer = huge_pages.empty(padded * k + 4 * padded, torch.int8)    # the blocks, then the scales
    blocks = buffer[: padded * k].view(padded // width, k, width)
    blocks.copy_(q.view(padded // width, width, k).transpose(1, 2))
    scales = buffer[padded * k:].view(torch.float32)
    scales.copy_(scale)
    return PackedWeight(blocks, n, scales)


class FewRowsKernel:
    """The built library: `linear(x, packed, bias)` computes x @ W^T + b for x [M, K] fp32."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        for name in ("few_rows_linear", "few_rows_linear_bf16", "few_rows_linear_i8", "few_rows_linear_q4_1"):
            getattr(self.lib, name).argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
            getattr(self.lib, name).restype = None
        self.width = int(self.lib.few_rows_width())
        self.lib.few_rows_q4_1_bytes.argtypes = [ctypes.c_long] * 2
        self.lib.few_rows_q4_1_bytes.restype = ctypes.c_long
        self.lib.few_rows_q4_1_pack.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
        self.lib.few_rows_q4_1_pack.restype = ctypes.c_int
        p, n = ctypes.c_void_p, ctypes.c_long
        self.lib.lean_layer.argtypes = [p] * 17 + [n] * 9 + [ctypes.c_float, ctypes.c_int, ctypes.c_int]
        self.lib.lean_layer.restype = None
        self.lib.lean_layer_qkv.argtypes = [p] * 9 + [n] * 7 + [ctypes.c_float, ctypes.c_int, ctypes.c_int]
        self.lib.lean_layer_qkv.restype = None
        self.lib.lean_layers.argtypes = [p] * 5 + [n, p, n, p] + [n] * 8 + [ctypes.c_float, ctypes.c_int, ctypes.c_int,
                                                                          p, n, p]
        self.lib.lean_layers.restype = None
        self.lib.lean_layer_scratch.argtypes = [n] * 7 + [ctypes.c_int]
        self.lib.lean_layer_scratch.restype = n
        self.lib.lean_final_norm.argtypes = [p, p, p, n, n, ctypes.c_float]
        self.lib.lean_final_norm.restype = None
        self.lib.draft_input.argtypes = [p] * 7 + [n] * 3 + [ctypes.c_float]
        self.lib.draft_input.restype = None
        self.lib.ngram_counts.argtypes = [p] * 3 + [n] * 2 + [ctypes.c_int] + [p] * 2 + [n] + [p] * 2 + [n] + [p] * 2
        self.lib.ngram_counts.restype = None
        self.lib.log_terms.argtypes = [p, n, ctypes.c_double, ctypes.c_double, p]
        self.lib.log_terms.restype = None
        self.lib.dart_search.argtypes = ([p, p, n, n, n, p, n, p, p, ctypes.c_double, ctypes.c_double, ctypes.c_int, n, n,
                                          p, n, p] + [p] * 13 + [ctypes.c_int])
        self.lib.dart_search.restype = n
        self.lib.pool_path_ranks.argtypes = [p] * 4 + [n, p, n, p]
        self.lib.pool_path_ranks.restype = n
        self.lib.few_rows_argmax.argtypes = [p, n, n, ctypes.c_int, p]
        self.lib.few_rows_argmax.restype = None
        self.lib.few_rows_choose.argtypes = [p, p, ctypes.c_int, p, p, ctypes.c_int, n, n, n, ctypes.c_int, p, p, p,
                                             p, p, ctypes.c_float, ctypes.c_int]
        self.lib.few_rows_choose.restype = None
        self.lib.int8_tiles_product.argtypes = [p, p, p, p, n, n, n, ctypes.c_int, ctypes.c_int, p, p]
        self.lib.int8_tiles_product.restype = None
        self.lib.amx_tiles_usable.restype = ctypes.c_int
        self.lib.vnni_built.restype = ctypes.c_int
        self.lib.bf16_dots_built.restype = ctypes.c_int
        self.lib.few_rows_reading.argtypes = [n]
        self.lib.few_rows_reading.restype = None
        self.lib.bf16_tiles_linear.argtypes = [p] * 4 + [n] * 3 + [ctypes.c_int] * 2
        self.lib.bf16_tiles_linear.restype = None
        self.lib.draft_rows_top.argtypes = [p, n, n, n, p, p, ctypes.c_int]
        self.lib.draft_rows_top.restype = None

    def pack(self, weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> PackedWeight:
        return pack(weight, self.width, dtype)

    def pack_q4_1(self, weight: torch.Tensor) -> PackedWeight | None:
        """`weight` (fp32) packed as Q4_1 blocks, whose product gives the bits of its fp32 product from a sixth of the
        bytes; None unless every output's every run of 32 inputs is such a block, rebuilt exactly."""
        n, k = weight.shape
        if weight.dtype != torch.float32 or k % Q4_RUN:
            return None
        w = weight.detach().contiguous()
        groups = -(-n // self.width)
        size = self.lib.few_rows_q4_1_bytes(k, n)
        blocks = huge_pages.empty(size, Q4_1).view(groups, k // Q4_RUN, size // (groups * (k // Q4_RUN)))
        if not self.lib.few_rows_q4_1_pack(w.data_ptr(), n, k, blocks.data_ptr()):
            return None
        return PackedWeight(blocks, n)

    def linear(self, x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        x = x.contiguous()
        rows, k = x.shape
        if not w.takes(k) or x.dtype != torch.float32:
            raise ValueError(f"few-row kernel: x {tuple(x.shape)} {x.dtype} against a packed weight of "
                             f"{w.out_features} outputs that takes other inputs")
        if not w.tiles and w.blocks.dtype != Q4_1 and w.blocks.shape[2] != self.width:
            raise ValueError(f"few-row kernel: a weight packed {w.blocks.shape[2]} outputs wide, this build reads "
                             f"{self.width} (FewRowsKernel.pack)")
        y = torch.empty(rows, w.out_features, dtype=torch.float32)
        args = (x.data_ptr(), w.blocks.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(), rows, k,
                w.out_features, torch.get_num_threads())
        if w.tiles:
            self.lib.bf16_tiles_linear(*args, BF16_WAYS[w.tiles])
        else:
            (self.lib.few_rows_linear, self.lib.few_rows_linear_bf16, self.lib.few_rows_linear_i8,
             self.lib.few_rows_linear_q4_1)[w.kind](*args)
        return y

    def argmax(self, y: torch.Tensor) -> torch.Tensor:
        """The index of each row's largest entry in y [M, N] fp32 (M >= 1, N < ARGMAX_COLUMNS), as `y.max(-1)`
        picks it: each thread scans the columns it computed in `linear`, still in its caches."""
        y = y.contiguous()
        out = torch.empty(y.shape[0], dtype=torch.long)
        self.lib.few_rows_argmax(y.data_ptr(), y.shape[0], y.shape[1], torch.get_num_threads(), out.data_ptr())
        return out


ARGMAX_COLUMNS = 2**24   # few_rows_argmax carries column indices in fp32 lanes: exact below this


def stand_in_linear(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's arithmetic in torch, from the same packed layout (where the real one cannot be built)."""
    y = torch.einsum("mk,bkv->mbv", x.float(), w.blocks.float()).reshape(x.shape[0], -1)
    if w.scales is not None:
        y = y * w.scales
    y = y[:, : w.out_features]
    return y if bias is None else y + bias


def kernel(kind: str) -> FewRowsKernel | None:
    """The kernel built for CPU kind `kind` (None where it cannot be built: see `why_not`)."""
    built = _built(kind)
    return built if isinstance(built, FewRowsKernel) else None


def why_not(kind: str) -> str | None:
    """Why the kernel cannot run here, or None when it can."""
    built = _built(kind)
    return built if isinstance(built, str) else None


@lru_cache(maxsize=None)
def _built(kind: str) -> FewRowsKernel | str:
    if os.environ.get("DART_FEW_ROWS") == "off":
        return "turned off (DART_FEW_ROWS=off)"
    compiler = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler (cc) on this machine"
    native = "-march=native" if platform.machine() in ("x86_64", "AMD64") else "-mcpu=native"
    march = MARCH.get(kind, native)
    if kind == "avx2-vnni" and "avx_vnni" not in cpu_flags():
        march = MARCH["avx2-vnni-stand-in"]
    last = ""
    for openmp in (["-fopenmp"], []):   # without OpenMP (Apple's clang) the kernel runs on one thread
        flags = ["-O3", *march.split(), *openmp, "-shared", "-fPIC", "-Werror=implicit-function-declaration"]
        path = _library_path(compiler, flags)
        if not path.is_file():
            last = _compile(compiler, flags, path)
            if last:
                continue
        try:
            return FewRowsKernel(path)
        except OSError as e:
            last = f"built but not loadable: {e}"
    if last.startswith(UNWRITABLE):
        return last
    probe = path.with_name("probe.so")
    broken = _compile(compiler, ["-O3", "-shared", "-fPIC"], probe, PROBE)
    probe.unlink(missing_ok=True)
    if broken:   # the machine's toolchain, not our sources (a compiler without the C library's headers, ...)
        return f"{NO_TOOLCHAIN}: {broken}"
    return f"the C compiler failed on our sources: {last}"


def sources_digest() -> str:
    """Our C sources, as a digest: what a measurement of the kernels depends on besides the machine."""
    return hashlib.sha256("\n".join(source.read_text() for source in SOURCES + HEADERS).encode()).hexdigest()[:16]


def _library_path(compiler: str, flags: list[str]) -> Path:
    """Named by everything the binary depends on: a shared cache never hands one CPU's build to another."""
    cpu = f"{cpu_name()} {' '.join(sorted(cpu_flags()))}"
    ident = "\n".join([sources_digest(), compiler, *flags, cpu, torch.__version__])
    return cache_root() / "kernels" / f"few_rows-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.so"


def _compile(compiler: str, flags: list[str], path: Path, source: str | None = None) -> str:
    """Builds the library at `path` (written whole or not at all) from our sources, or from `source` (C text);
    returns '' or the compiler's complaint."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
    except OSError as e:   # a cache folder that cannot be written (a read-only home)
        return f"{UNWRITABLE} {path.parent}: {e}"[:200]
    try:
        with tempfile.TemporaryDirectory(dir=path.parent) as work:
            if source is None:
                inputs = _objects(compiler, flags, work)
                if isinstance(inputs, str):
                    return inputs
            else:
                inputs = ["-x", "c", "-"]
            done = subprocess.run([compiler, *flags, *inputs, "-o", tmp, "-lm"], capture_output=True, text=True,
                                  input=source, timeout=BUILD_SECONDS)
        if done.returncode != 0:
            return _complaint(done.returncode, done.stderr)
        os.replace(tmp, path)
        return ""
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)[:200]
    finally:
        Path(tmp).unlink(missing_ok=True)


def _objects(compiler: str, flags: list[str], work: str) -> list[str] | str:
    """Our sources compiled side by side, one compiler a source (on 2 cores the build takes the time of few_rows.c
    alone, 8.5 s, instead of all five in turn, 17.7: AMD EPYC Zen 3): their object files, or the first complaint."""
    objects = [str(Path(work) / f"{source.stem}.o") for source in SOURCES]
    compiling, complaints = [], []
    try:
        for source, obj in zip(SOURCES, objects):
            command = [compiler, *(f for f in flags if f != "-shared"), "-c", str(source), "-o", obj]
            compiling.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for job in compiling:
            _, err = job.communicate(timeout=BUILD_SECONDS)
            if job.returncode != 0:
                complaints.append(_complaint(job.returncode, err))
    finally:
        for job in compiling:
            if job.poll() is None:   # a complaint, a timeout or a compiler that would not start: none left
                job.kill()
    return complaints[0] if complaints else objects


def _complaint(returncode: int, stderr: str) -> str:
    """The compiler's first error line (or its last line), at most 200 characters."""
    lines = stderr.strip().splitlines()
    said = next((line for line in lines if "error" in line), lines[-1] if lines else "")
    return (said or f"exit status {returncode}")[:200]
