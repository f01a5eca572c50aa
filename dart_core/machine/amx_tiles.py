"""Weights packed as tiles for int8_tiles.c and bf16_tiles.c, zeros past their edges, and how their products run here: the output copy's
integer product (tiles of 16 outputs by 64 int8 inputs, the layout AMX's int8 products read, and VNNI's a row of a
tile at a time) and a bf16 model's products (tiles of 16 outputs by 32 bf16 inputs, the layout of AMX's bf16
products, and AVX512-BF16's a row of a tile at a time)."""

from __future__ import annotations

import torch

from . import huge_pages
from .few_rows import BF16_WAYS, FewRowsKernel, PackedWeight

TILE_N, TILE_K = 16, 64      # outputs and int8 inputs per tile (16 rows of 4)
PAIR_K = 32                  # bf16 inputs per tile (16 rows of 2)
# how a product runs: not from the tiles (the FMAs), on AMX, by the plain-C stand-in, or by VNNI (int8_tiles.c's modes)
MODES = {"off": 0, "amx": 1, "stand-in": 2, "vnni": 3}


def usable(kernel: FewRowsKernel) -> bool:
    """Whether this CPU, the build and the OS let our kernels use AMX."""
    return bool(kernel.lib.amx_tiles_usable())


def vnni_usable(kernel: FewRowsKernel) -> bool:
    """Whether our kernels were built with VNNI: AVX-512's, or AVX-VNNI's 256 bits on a CPU without AVX-512 (for this
    CPU: it has them)."""
    return bool(kernel.lib.vnni_built())


def tiles_mode(kernel: FewRowsKernel, asked: str) -> str:
    """The mode `asked` ("auto": AMX where usable, else VNNI where built, else off) as it will run here; refuses AMX
    or VNNI where they cannot run."""
    if asked == "auto":
        return "amx" if usable(kernel) else "vnni" if vnni_usable(kernel) else "off"
    if asked not in MODES:
        raise ValueError(f"tiles {asked!r}: one of 'auto', {', '.join(repr(m) for m in MODES)}")
    if asked == "amx" and not usable(kernel):
        raise ValueError("AMX tiles are not available here (the CPU, the compiler or the OS)")
    if asked == "vnni" and not vnni_usable(kernel):
        raise ValueError("VNNI is not available here (the CPU or the build)")
    return asked


def int8_tiles(copy: PackedWeight, k: int) -> torch.Tensor:
    """An int8 copy (few_rows.pack: blocks and a scale per output) as the product's tiles,
    [ceil(N / 16), ceil(k / 64), 16, 16, 4]; its scales stay where they are."""
    n = copy.out_features
    q = copy.blocks.transpose(1, 2).reshape(-1, k)[:n]
    padded = torch.zeros(-(-n // TILE_N) * TILE_N, -(-k // TILE_K) * TILE_K, dtype=torch.int8)
    padded[:n, :k] = q
    b, c = padded.shape[0] // TILE_N, padded.shape[1] // TILE_K
    return huge_pages.copy_of(padded.view(b, TILE_N, c, TILE_K // 4, 4).permute(0, 2, 3, 1, 4))


def bf16_tiles(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 weight [N, K] as the tiles of bf16_tiles.c's product, [ceil(N / 16), ceil(K / 32), 16, 16, 2]: for
    each block of 16 outputs and chunk of 32 inputs, 16 pairs of inputs of every output."""
    n, k = weight.shape
    padded = torch.zeros(-(-n // TILE_N) * TILE_N, -(-k // PAIR_K) * PAIR_K, dtype=torch.bfloat16)
    padded[:n, :k] = weight.detach()
    b, c = padded.shape[0] // TILE_N, padded.shape[1] // PAIR_K
    return huge_pages.copy_of(padded.view(b, TILE_N, c, PAIR_K // 2, 2).permute(0, 2, 3, 1, 4))


def packed_bf16_tiles(weight: torch.Tensor, way: str) -> PackedWeight:
    """`weight` [N, K] rounded to bf16 and packed as the bf16 product's tiles, its products to run `way` (BF16_WAYS),
    for the few-row kernel's `linear` and the C layer."""
    return PackedWeight(bf16_tiles(weight.bfloat16()), weight.shape[0], tiles=way)


def bf16_dots_usable(kernel: FewRowsKernel) -> bool:
    """Whether our kernels were built with AVX512-BF16's VDPBF16PS (for this CPU: it has it)."""
    return bool(kernel.lib.bf16_dots_built())


def bf16_way(kernel: FewRowsKernel, weights: torch.dtype, asked: str | None) -> str:
    """How products on `weights` run: "" (the FMAs on the widened weights: fp32 weights, or bf16 ones as `asked`
    "off") or a way of BF16_WAYS for bf16 ones on tiles. `asked` None: on AMX where usable, else by AVX512-BF16
    where built, else "". A way asked where its instruction is missing runs its stand-in, slowly: the tests' way."""
    if asked is not None and asked != "off" and asked not in BF16_WAYS:
        raise ValueError(f"bf16 tiles {asked!r}: one of 'off', {', '.join(repr(w) for w in BF16_WAYS)}")
    if weights != torch.bfloat16 or asked == "off":
        return ""
    if asked is None:
        return "amx" if usable(kernel) else "avx512-bf16" if bf16_dots_usable(kernel) else ""
    return asked


def pack(kernel: FewRowsKernel, weight: torch.Tensor, weights: torch.dtype, tiles: str) -> PackedWeight:
    """`weight` packed for the C layer in `weights`: as bf16 tiles whose products run `tiles` (a way of BF16_WAYS),
    else ("") for the few-row kernel."""
    return packed_bf16_tiles(weight, tiles) if tiles else kernel.pack(weight, weights)


def tile_sums(tiles: torch.Tensor) -> torch.Tensor:
    """Each output's sum of weights over its tiles, [blocks * 16] int32: what the VNNI product takes off again (its
    digits go in plus 128)."""
    blocks = tiles.shape[0]
    sums = torch.empty(blocks, TILE_N, dtype=torch.int32)
    step = 256   # blocks at a time: a few megabytes of int32 instead of four times the copy
    for b in range(0, blocks, step):
        sums[b:b + step] = tiles[b:b + step].to(torch.int32).sum(dim=(1, 2, 4))
    return sums.reshape(-1)
