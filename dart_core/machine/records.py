"""Where a run ran and what was chosen there, as records: the verify cost curve t(k), the dtype and the draft head's
kernels chosen on the machine, and the machine record that traces and the bench report keep.

Each record owns its fields, its file form (`to_dict` / `from_dict`, which also reads what older versions wrote)
and its one line (`text()`). The set-up code measures and caches them (dart_core.setup.calibration,
dart_core.setup.dtype_choice); the engine, the views and the tools only read them.

A dtype has one spelling in every record, the command line's: fp32, bf16, fp16 (older files wrote torch's names,
float32 and bfloat16, in the machine record and the dtype choice's timings; they are read as these).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from .hardware import Hardware

# torch's name of each dtype -> the one spelling records use
DTYPE_SPELLING = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
CURVE_CONTEXT = 256        # tokens in the cache when the cost curve is measured: a typical prompt plus some output
# how the output copy's integer product runs (machine/amx_tiles.py's modes), as a record says it
COPY_PRODUCTS = {"amx": "on AMX tiles", "vnni": "by VNNI"}
# how a bf16 model's products run from tiles (machine/few_rows.py's BF16_WAYS), as a record says it
BF16_PRODUCTS = {"amx": "on AMX tiles", "avx512-bf16": "by AVX512-BF16", "stand-in": "on tiles, by the stand-in"}


def dtype_spelling(dtype) -> str:
    """fp32, bf16 or fp16, for a torch dtype or any spelling of one ("torch.float32", "float32", "fp32")."""
    name = str(dtype).removeprefix("torch.")
    return DTYPE_SPELLING.get(name, name)


@dataclass
class CostCurve:
    """t(k): seconds of one verify forward of k tokens on this machine, for the loaded model, dtype and threads.
    `seconds` is the fit (never decreasing in k: a larger tree never costs less), `measured` the medians it was
    fitted to (for the cost chart; None for a curve given by hand)."""
    rows: tuple[int, ...]
    seconds: tuple[float, ...]
    context: int = CURVE_CONTEXT
    measured: tuple[float, ...] | None = None

    def time(self, k: float) -> float:
        """t(k), linear between the measured sizes (and beyond the largest, along its last segment): `times` for one
        size, in plain Python (the automatic budget asks it after every verify; numpy's call costs 0.1 ms)."""
        rows, secs = self.rows, self.seconds
        i = bisect.bisect_right(rows, k) - 1
        if i < 0 or rows[i] == k:
            return float(secs[max(i, 0)])
        j = min(i, len(rows) - 2)   # beyond the largest: its last segment
        return float(secs[j] + (secs[j + 1] - secs[j]) / (rows[j + 1] - rows[j]) * (k - rows[j]))

    def times(self, k) -> np.ndarray:
        """`time` over an array of sizes at once (the automatic budget weighs hundreds of trees per choice)."""
        k = np.asarray(k, dtype=np.float64)
        rows, secs = np.asarray(self.rows, dtype=np.float64), np.asarray(self.seconds)
        inside = np.interp(k, rows, secs)
        slope = (secs[-1] - secs[-2]) / (rows[-1] - rows[-2])
        return np.where(k > rows[-1], secs[-1] + slope * (k - rows[-1]), inside)

    def relative(self, k: int) -> float:
        """t(k) / t(1): what a verify of k tokens costs in one-token forwards."""
        return self.time(k) / self.seconds[0]

    def scaled(self, factor: float) -> "CostCurve":
        """The same shape, every time multiplied by `factor` (what a run measured against what the curve said)."""
        measured = None if self.measured is None else tuple(m * factor for m in self.measured)
        return CostCurve(self.rows, tuple(s * factor for s in self.seconds), self.context, measured)

    def text(self) -> str:
        """'t(1) 31.0 ms, t(64) 112.0 ms (3.61x)'."""
        k = self.rows[-1]
        return f"t(1) {self.seconds[0] * 1e3:.1f} ms, t({k}) {self.time(k) * 1e3:.1f} ms ({self.relative(k):.2f}x)"

    def to_dict(self) -> dict:
        d = {"rows": list(self.rows), "seconds": [round(s, 6) for s in self.seconds], "context": self.context}
        if self.measured is not None:
            d["measured"] = [round(s, 6) for s in self.measured]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CostCurve":
        measured = tuple(float(s) for s in d["measured"]) if d.get("measured") else None   # absent in older files
        return cls(tuple(int(r) for r in d["rows"]), tuple(float(s) for s in d["seconds"]), int(d["context"]),
                   measured)

    def recorded(self) -> "CostCurve":
        """The curve as a file holds it (its times rounded): what a replay of the run reads back."""
        return CostCurve.from_dict(self.to_dict())


@dataclass
class DtypeChoice:
    """The dtype chosen for the target (dart_core.setup.dtype_choice), and why."""
    dtype: str                                 # "fp32", "bf16" or "fp16"
    reason: str                                # one line, for --json, the bench report and the app's header
    seconds: dict[str, list[float]] | None = None   # per dtype, one pass over the decoder linears at DTYPE_ROWS
    why: str = ""                              # the reason's gist, without the dtype and the measurements

    @classmethod
    def because(cls, dtype: str, why: str, detail: str = "", seconds: dict | None = None) -> "DtypeChoice":
        """The choice of `dtype` for the reason `why` (`detail`: what follows it in the reason, measurements)."""
        if seconds is not None:
            seconds = {dtype_spelling(k): list(v) for k, v in seconds.items()}
        return cls(dtype, f"{dtype}: {why}{detail}", seconds, why)

    def text(self) -> str:
        """'fp32 (bf16 is not faster here)': the dtype and its gist, for the app's header."""
        return f"{self.dtype} ({self.why})"

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "reason": self.reason, "seconds": self.seconds, "why": self.why}

    @classmethod
    def from_dict(cls, d: dict) -> "DtypeChoice":
        dtype, reason = dtype_spelling(d["dtype"]), str(d["reason"])
        seconds = {dtype_spelling(k): [float(s) for s in v] for k, v in d["seconds"].items()} \
            if d.get("seconds") else None
        # older files have no gist: the reason after its dtype stands for it
        return cls(dtype, reason, seconds, str(d.get("why") or reason.removeprefix(f"{dtype}: ")))


# How DART's head drafts: through our C layer with bf16 or int8 weights (dart_core/draft_native.py), an int8 copy of
# the head (dart_core/draft_kernels.py), or torch on the head as it is; 'auto': the fastest of them measured here.
NATIVE_KERNELS, NATIVE_INT8_KERNELS, INT8_KERNELS, FP32_KERNELS = "native", "native-int8", "int8", "fp32"
AUTO_KERNELS = "auto"
DRAFT_KERNELS = (NATIVE_KERNELS, NATIVE_INT8_KERNELS, INT8_KERNELS, FP32_KERNELS)
DRAFT_KERNEL_MODES = (AUTO_KERNELS, *DRAFT_KERNELS)
KERNEL_WORDS = {NATIVE_KERNELS: "in bf16 through our C layer", NATIVE_INT8_KERNELS: "in int8 through our C layer",
                INT8_KERNELS: "in int8", FP32_KERNELS: "in fp32"}
ROUNDED_KERNELS = (NATIVE_INT8_KERNELS, INT8_KERNELS)   # their rows differ a little from the head's own


@dataclass
class DraftKernelChoice:
    """How DART's head drafts on this machine (DRAFT_KERNELS), and why."""
    kernels: str
    reason: str
    seconds: dict[str, float] | None = None   # when measured: one drafting step with each kernels measured

    @property
    def int8(self) -> bool:
        return self.kernels == INT8_KERNELS

    def text(self) -> str:
        return self.reason

    def to_dict(self) -> dict:
        d = {"kernels": self.kernels, "reason": self.reason}
        if self.seconds is not None:
            d["seconds"] = dict(self.seconds)
        return d

    @classmethod
    def from_dict(cls, d: dict | str) -> "DraftKernelChoice":
        if isinstance(d, str):   # bench reports before this record wrote the kernels alone, "int8" or "fp32"
            return cls(d, d)
        seconds = {k: float(v) for k, v in d["seconds"].items()} if d.get("seconds") else None
        if "kernels" not in d:   # records from before the C layer drafted: int8 or not
            return cls(INT8_KERNELS if d["int8"] else FP32_KERNELS, str(d["reason"]), seconds)
        return cls(str(d["kernels"]), str(d["reason"]), seconds)


@dataclass
class KernelsInUse:
    """The kernel plan in force (dart_core.machine.kernels.FastLinears): per linear shape, the kernel at each row
    bucket, and the memory of the packed weight copies."""
    buckets: tuple[int, ...]
    choices: dict[str, list[str]]
    extra_mb: float = 0.0

    def to_dict(self) -> dict:
        return {"buckets": list(self.buckets), "choices": {k: list(v) for k, v in self.choices.items()},
                "extra_mb": self.extra_mb}

    @classmethod
    def from_dict(cls, d: dict) -> "KernelsInUse":
        return cls(tuple(int(b) for b in d["buckets"]), {k: list(v) for k, v in d["choices"].items()},
                   float(d.get("extra_mb") or 0.0))


def _int_or_none(value) -> int | None:
    return None if value is None else int(value)


def _bf16_way(value) -> str:
    """A record's bf16 tiles: their way, as records older than the ways wrote it (True: AMX)."""
    return "amx" if value is True else str(value or "")


@dataclass
class MachineRecord:
    """Where a run ran, as traces and the bench report record it: the hardware (and its one line as it was
    described then), the kernels in use, the dtype and why, the verify cost curve (runs with an automatic budget),
    and how DART's head drafted (runs with a head)."""
    hardware: Hardware = field(default_factory=Hardware)
    summary: str = ""                          # the hardware in one line (Hardware.describe())
    kernels: KernelsInUse | None = None        # the linears' kernels (FastLinears.summary()); None: torch's
    dtype: str = "fp32"
    dtype_choice: DtypeChoice | None = None    # where the dtype was chosen (--dtype auto or fast)
    cost_curve: CostCurve | None = None
    draft_kernels: DraftKernelChoice | None = None
    forward: str = ""     # which forward decoded (TargetModel.forward_kind); "" in records older than it
    greedy_copy_rows: int | None = None   # greedy steps of up to these rows read the output layer's copy (measured)
    greedy_copy_tile_rows: int | None = None   # ... computing its integer product from these rows (measured)
    huge_pages: bool | None = None   # the C layer's weights on huge pages (machine/huge_pages.py); None: no C layer
    greedy_copy_tiles: str = ""      # that product's way: "amx" or "vnni" (records older than VNNI: AMX)
    bf16_tiles: str = ""             # a bf16 model's products from tiles, their way (lean_native.py); "": none
    prefetch_from: int | None = None  # the C layer's one-pass products prefetch from these rows (measured)
    stream_rows: int = 0              # ... and read one block at a time up to these rows (measured; records from
    #                                   before few_rows.c packed its weights in groups of blocks read as one stream)
    prefill: str = ""    # prompts longer than its rows the C layer prefilled: "any length", "up to N tokens"; "": none
    q4_1_rows: int = 0   # steps of up to these rows read the fp32 weights as their Q4_1 blocks (measured); 0: none

    def text(self) -> str:
        """'AMD EPYC · AVX2 · 2 threads · bf16 kernels: no · fp32 · lean-native forward · output copy up to 16 rows
        · drafting in int8' ('... up to 64 rows, on AMX tiles from 4 ...' where its product runs there, '... by VNNI
        from 8 ...')."""
        forward = f" · {self.forward} forward" if self.forward else ""
        way = COPY_PRODUCTS.get(self.greedy_copy_tiles or "amx", self.greedy_copy_tiles)
        tiles = f", {way} from {self.greedy_copy_tile_rows}" if self.greedy_copy_tile_rows is not None else ""
        copy = f" · output copy up to {self.greedy_copy_rows} rows{tiles}" if self.greedy_copy_rows is not None else ""
        drafting = f" · drafting in {self.draft_kernels.kernels}" if self.draft_kernels is not None else ""
        pages = " · weights on huge pages" if self.huge_pages else ""
        tiles = f" · bf16 products {BF16_PRODUCTS.get(self.bf16_tiles, self.bf16_tiles)}" if self.bf16_tiles else ""
        ahead = f" · prefetching from {self.prefetch_from} rows" if (self.prefetch_from or 1) > 1 else ""
        rows = "1 row" if self.stream_rows == 1 else f"{self.stream_rows} rows"
        ahead += f" · one stream up to {rows}" if self.stream_rows else ""
        prefill = f" · prompts of {self.prefill} in the C layer" if self.prefill else ""
        blocks = f" · Q4_1 blocks up to {self.q4_1_rows} rows" if self.q4_1_rows else ""
        return (f"{self.summary or self.hardware.describe()} · {self.dtype}{forward}{tiles}{blocks}{copy}{drafting}"
                f"{pages}{ahead}{prefill}")

    def to_dict(self) -> dict:
        d = {"hardware": self.hardware.to_dict(), "summary": self.summary,
             "kernels": None if self.kernels is None else self.kernels.to_dict(),
             "dtype": self.dtype, "dtype_choice": None if self.dtype_choice is None else self.dtype_choice.to_dict(),
             "cost_curve": None if self.cost_curve is None else self.cost_curve.to_dict(), "forward": self.forward}
        if self.draft_kernels is not None:
            d["draft_kernels"] = self.draft_kernels.to_dict()
        if self.greedy_copy_rows is not None:
            d["greedy_copy_rows"] = self.greedy_copy_rows
        if self.greedy_copy_tile_rows is not None:
            d["greedy_copy_tile_rows"] = self.greedy_copy_tile_rows
            d["greedy_copy_tiles"] = self.greedy_copy_tiles
        if self.huge_pages is not None:
            d["huge_pages"] = self.huge_pages
        if self.bf16_tiles:
            d["bf16_tiles"] = self.bf16_tiles
        if self.prefetch_from is not None:
            d["prefetch_from"] = self.prefetch_from
        if self.stream_rows:
            d["stream_rows"] = self.stream_rows
        if self.prefill:
            d["prefill"] = self.prefill
        if self.q4_1_rows:
            d["q4_1_rows"] = self.q4_1_rows
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "MachineRecord":
        """Lenient, as traces of every version wrote it: a missing part is None (or this record's default)."""
        return cls(
            hardware=Hardware.from_dict(d["hardware"]) if d.get("hardware") else Hardware(),
            summary=str(d.get("summary") or ""),
            kernels=KernelsInUse.from_dict(d["kernels"]) if d.get("kernels") else None,
            dtype=dtype_spelling(d.get("dtype") or "fp32"),
            dtype_choice=DtypeChoice.from_dict(d["dtype_choice"]) if d.get("dtype_choice") else None,
            cost_curve=CostCurve.from_dict(d["cost_curve"]) if d.get("cost_curve") else None,
            draft_kernels=DraftKernelChoice.from_dict(d["draft_kernels"]) if d.get("draft_kernels") else None,
            forward=str(d.get("forward") or ""),
            greedy_copy_rows=_int_or_none(d.get("greedy_copy_rows")),
            greedy_copy_tile_rows=_int_or_none(d.get("greedy_copy_tile_rows")),
            huge_pages=bool(d["huge_pages"]) if d.get("huge_pages") is not None else None,
            greedy_copy_tiles=str(d.get("greedy_copy_tiles") or ""), bf16_tiles=_bf16_way(d.get("bf16_tiles")),
            prefetch_from=_int_or_none(d.get("prefetch_from")), stream_rows=int(d.get("stream_rows") or 0),
            prefill=str(d.get("prefill") or ""), q4_1_rows=int(d.get("q4_1_rows") or 0))
