"""The target's greedy choice from its output layer without every fp32 logit, exactly.

Greedy decoding needs each verified row's argmax, not its logits, and on a CPU the output layer is a fifth of a decode
step: it streams the whole [vocabulary, hidden] weight (113 MB in fp32 for the default model) for one row or eight.
So the product is computed from a copy of the weight in bf16 (half the bytes) or int8 (a quarter), and then exactly,
in fp32, only for the outputs that copy cannot rule out:

    |y_j - y~_j| <= |x|_2 * a_j,   a_j = |w_j - w~_j|_2 + g * (|w_j|_2 + |w~_j|_2),   g = (K + 2) u / (1 - (K + 2) u)

(Cauchy-Schwarz for the weights' difference; the standard bound on the rounding of a K-term dot product, u = 2^-24,
for each of the two computed products, the int8 copy's scaling included). The argmax j* of the exact logits has
y~_j* + |x| a_j* >= y_j* >= y_i >= y~_i - |x| a_i for every i: it is among the outputs whose upper end reaches the
largest lower end. Those are computed by the same fp32 product as the full layer (machine/few_rows.c), so with the same
bits, and the first of their maxima is the argmax of the full layer, ties included. For the default model a row
leaves a median of 66 outputs of 49,152 in doubt with the int8 copy, 2 with a bf16 one (docs/cpu-speed.md, section 11).

With an int8 copy on a CPU with AMX, the copy's product runs on AMX tiles (machine/int8_tiles.c), x written as two
int8 digits per input; the bound then widens by |x - x~|_2 times the copy's largest row norm, a few parts in ten
thousand of |x|. An fp32 product of the int8 copy is bound by arithmetic from 8 rows; the tiles' cost hardly grows
with the rows, though at one row they can cost a little more: steps of fewer rows than `tile_rows` (measured per
machine) keep the FMAs (docs/cpu-speed.md, section 12). A CPU with VNNI (AVX-512's, or AVX-VNNI) and no AMX computes
the same integer sums from the same tiles by VNNI, four times the products an instruction of the FMAs on the widened
copy (section 16).

Sampling needs every logit: it takes the full fp32 layer (TargetModel.verify without `choices`).
"""

from __future__ import annotations

import functools

import torch

from .machine import amx_tiles
from .machine.few_rows import WEIGHT_KINDS, FewRowsKernel, PackedWeight

UNIT = 2.0 ** -24          # fp32's unit roundoff
BOUND_ROWS = 4096          # weight rows whose bounds are computed at once (in fp64)


def choice_bounds(weight: torch.Tensor, approx: PackedWeight) -> torch.Tensor:
    """a_j for every output j (fp32, rounded up), from the fp32 weight [N, K] and its packed copy."""
    n, k = weight.shape
    g = (k + 2) * UNIT / (1 - (k + 2) * UNIT)
    rows = unpacked(approx, n)
    out = torch.empty(n, dtype=torch.float64)
    for a in range(0, n, BOUND_ROWS):
        w, w_approx = weight[a:a + BOUND_ROWS].double(), rows(a, a + BOUND_ROWS)
        out[a:a + BOUND_ROWS] = (w - w_approx).norm(dim=1) + g * (w.norm(dim=1) + w_approx.norm(dim=1))
    # one part in a million more, and up to the next fp32: the fp64 sums' own rounding is far below it
    return torch.nextafter((out * (1 + 1e-6)).float(), torch.tensor(float("inf")))


def largest_norm(approx: PackedWeight, n: int) -> float:
    """max_j |w~_j|_2 of a packed copy, rounded up to an fp32."""
    rows = unpacked(approx, n)
    most = max(float(rows(a, a + BOUND_ROWS).norm(dim=1).max()) for a in range(0, n, BOUND_ROWS))
    return float(torch.nextafter(torch.tensor(most * (1 + 1e-6), dtype=torch.float32), torch.tensor(float("inf"))))


def unpacked(approx: PackedWeight, n: int):
    """rows(a, b): the packed copy's rows a..b-1 as the kernel reads them, in fp64 (exact: bf16, and int8 times its
    fp32 scale, are fp64 numbers)."""
    blocks = approx.blocks
    width = blocks.shape[2]

    def rows(a: int, b: int) -> torch.Tensor:
        b = min(b, n)
        first, last = a // width, (b - 1) // width + 1
        part = blocks[first:last].transpose(1, 2).reshape(-1, blocks.shape[1])[a - first * width: b - first * width]
        part = part.double()
        return part if approx.scales is None else part * approx.scales[a:b, None].double()
    return rows


class GreedyOutput:
    """An output layer (weight [N, K] in fp32 or bf16, no bias) that gives the argmax of x w^T per row as our product
    computes it from that weight, exactly, reading a smaller copy of the weight (bf16 or int8; int8 for a bf16 weight)
    and the few rows of the weight itself that the copy leaves in doubt."""

    def __init__(self, weight: torch.Tensor, kernel: FewRowsKernel, kind: torch.dtype = torch.bfloat16,
                 tiles: str = "auto"):
        """tiles: how an int8 copy's product is computed: "amx" (on AMX tiles), "vnni" (the tiles' integer sums by
        VNNI), "off" (fp32 FMAs), "auto" (AMX where this CPU and its OS allow it, else VNNI where it has it,
        else off), or "stand-in" (the tiles' integer sums in plain C: the same bits, slowly)."""
        if kind not in (torch.bfloat16, torch.int8) or weight.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"the output layer's copy is bf16 or int8 of an fp32 or bf16 weight, not {kind} of "
                             f"{weight.dtype}")
        if kind != torch.int8 and tiles not in ("auto", "off"):
            raise ValueError(f"tiles {tiles!r}: a bf16 copy has none ('auto' or 'off')")
        tiles = amx_tiles.tiles_mode(kernel, tiles) if kind == torch.int8 else "off"
        self.kernel, self.kind, self.tiles_mode = kernel, kind, tiles
        self.weight = weight.detach().contiguous()   # read in place: its rows in doubt are computed from it
        self.approx = kernel.pack(self.weight, kind)
        self.bound = choice_bounds(self.weight, self.approx)
        n, k = self.weight.shape
        self.tiles = amx_tiles.int8_tiles(self.approx, k) if tiles != "off" else None
        self.tiles_norm = largest_norm(self.approx, n) if tiles != "off" else 0.0
        # steps of at least this many rows use the tiles (None: none; as measured: setup/calibration.py)
        self.tile_rows: int | None = 1
        self.scratch = torch.empty(0)

    @functools.cached_property
    def tile_sums(self) -> torch.Tensor | None:
        """Each output's sum of weights over the tiles, which the VNNI product reads (made at its first use: a pass over
        the copy that AMX and the FMAs never need)."""
        return amx_tiles.tile_sums(self.tiles) if self.tiles is not None else None

    def choose(self, x: torch.Tensor, candidates: torch.Tensor | None = None) -> torch.Tensor:
        """The argmax of x w^T per row of x [M, K] (fp32), the first of equal maxima, as our fp32 product from the weight
        computes the logits; `candidates` (a [M] long tensor, optional) receives how many outputs each row computed
        exactly."""
        x = x.float().contiguous()
        m, (n, k) = x.shape[0], self.weight.shape
        out = torch.empty(m, dtype=torch.long)
        if self.scratch.numel() < m * n:   # kept between steps: a fresh megabyte costs its page faults every step
            self.scratch = torch.empty(m * n)
        scratch = self.scratch
        mode = self.tiles_mode if self.tile_rows is not None and m >= self.tile_rows else "off"
        self.kernel.lib.few_rows_choose(
            x.data_ptr(), self.approx.blocks.data_ptr(), WEIGHT_KINDS[self.kind], self.bound.data_ptr(),
            self.weight.data_ptr(), WEIGHT_KINDS[self.weight.dtype], m, k, n, torch.get_num_threads(),
            scratch.data_ptr(), out.data_ptr(), None if candidates is None else candidates.data_ptr(),
            None if self.tiles is None else self.tiles.data_ptr(),
            self.tile_sums.data_ptr() if mode == "vnni" else None, self.tiles_norm, amx_tiles.MODES[mode])
        return out
