"""Measurements of this machine, cached in the user cache: the kernel per linear shape, and the verify cost curve.

Both depend on the CPU (its model and capability level), torch's version, the threads, the dtype and the model's
shapes, and take a few seconds: they are measured at the first load with those and read back afterwards.
`recalibrate=True` (the command line's --recalibrate) measures again.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import draft_native
from ..draft_kernels import head_step, int8_copy, int8_supported, native_step, time_drafting
from ..errors import ConfigError
from ..machine import few_rows
from ..machine.few_rows import Reading
from ..machine.hardware import Hardware
from ..machine.kernels import KernelPlan, decoder_linears, measure_plan, onednn_applies, packed_linear, shape_key
from ..machine.records import (AUTO_KERNELS, CURVE_CONTEXT, DRAFT_KERNEL_MODES, DRAFT_KERNELS, FP32_KERNELS,
                               INT8_KERNELS, KERNEL_WORDS, NATIVE_INT8_KERNELS, NATIVE_KERNELS, ROUNDED_KERNELS,
                               CostCurve, DraftKernelChoice, MachineRecord, dtype_spelling)
from ..target import TargetModel
from ..tree import TokenTree
from .defaults import cache_root
from .files import write_atomic

# verify sizes (tree nodes + root) measured: with each size just past one where a kernel may switch (the Q4_1 blocks,
# the output copy and the reading ways are chosen per row count among 1, 2, 4, 8, 12, 16, 32), so that no straight
# line of the curve bridges a switch (on the EPYC Zen 5, 9 rows took 12 ms where the line from 8 to 12 said 7.9)
CURVE_ROWS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 17, 24, 32, 33, 48, 64)
GPU_CURVE_ROWS = CURVE_ROWS + (96, 128, 192, 256)          # on a GPU, up to the largest budget it considers
GREEDY_COPY_ROWS = (1, 4, 8, 16, 32, 64)   # greedy verify sizes at which the output layer's copy is timed
CURVE_ROUNDS = 3           # timed passes over every size, interleaved (a slow moment hits all sizes alike); median
READING_ROWS = (1, 2, 4, 8)   # greedy verify sizes at which the ways of reading the weights are timed
READING_ROUNDS = 9            # (they differ by a fifth at most: more passes than the curve's)
# the ways of reading the weights timed (few_rows.Reading): prefetching ahead, or leaving it to the hardware
READING_WAYS = {"ahead": Reading(1), "hardware": Reading(READING_ROWS[-1] + 1)}
# Leaving the prefetching to the hardware must win by this much: on the EPYC Zen 5 it won a quiet hour by 1-3% at one
# row and lost a busy one by 6-10% (docs/cpu-speed.md, section 22), and a calibration sees one hour.
READING_MARGIN = 1.05
# greedy verify sizes at which Q4_1 blocks and the fp32 packing are timed (12: on the EPYC Zen 5 the blocks won at 12
# rows, 7.99 against 10.64 ms for the decoder's products, and lost or tied at 16 by the minute)
Q4_1_ROWS = (1, 4, 8, 12, 16, 32, 64)
PREFILL_ROWS = (128, 384)   # prompt lengths at which a prefill through the C layer and through torch's step are timed
PREFILL_ROUNDS = 1          # (where they differ, by a third or more: one pass after the warm-up)
# how the cached curve was made (each size timed after a verify of its own size, the median of 3, fitted never to
# decrease): a curve made another way is measured again
CURVE_FIT = "median3+isotonic, after its own size"
FORMAT = "dart-lab-calibration/1"


def monotone_fit(seconds) -> tuple[float, ...]:
    """The closest never-decreasing sequence (least squares): a verify of more tokens does not cost less, so a
    size measured faster than a smaller one was noise (seen: t(12) 104 ms, t(16) 85 ms)."""
    blocks: list[list[float]] = []   # pool adjacent violators: [mean, count] runs, merged while one falls
    for s in seconds:
        blocks.append([float(s), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return tuple(mean for mean, count in blocks for _ in range(int(count)))


def machine_key(target: TargetModel, what: str, extra: str = "") -> str:
    """What a measurement depends on, as a file name: the machine, torch, threads and the model's shapes."""
    return model_key(target.hardware, target.model, str(target.dtype), what, extra)


def model_key(hw: Hardware, model, dtype: str, what: str, extra: str = "") -> str:
    """machine_key for a transformers model not yet wrapped as a target."""
    shapes = sorted({shape_key(m) for m in decoder_linears(model)})
    return _file_name(what, hw, [dtype, shapes, extra])


def _file_name(what: str, hw: Hardware, depends_on: list) -> str:
    """A measurement's cache file: `what`, then a digest of the machine, torch and what else it depends on."""
    stand_ins = [list(hw.stand_ins)] if hw.stand_ins else []   # a test's simulated capabilities measure apart
    limits = [hw.limits] if hw.limits else []    # so do runs held to an older CPU kind (hardware.CPU_KINDS)
    # a plan measured without our kernels is not read where they are built, nor one measured with other sources
    kernels = ["few_rows", few_rows.sources_digest()] if hw.few_rows else []
    ident = json.dumps([FORMAT, what, hw.name, hw.capability, hw.threads, torch.__version__, *depends_on, *stand_ins,
                        *limits, *kernels])
    return f"{what}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"


def cached(name: str, recalibrate: bool, measure, read, write, label: str):
    path = cache_root() / "calibration" / name
    if path.is_file() and not recalibrate:
        try:
            return read(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            pass   # a damaged cache file is measured again
    t0 = time.perf_counter()
    record = write(measure())
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda tmp: Path(tmp).write_text(json.dumps(record)))
    print(f"[dart] measured {label} on this machine in {time.perf_counter() - t0:.1f} s (cached in {path})",
          file=sys.stderr, flush=True)
    return read(record)   # exactly what later loads will read back


def kernel_plan(target: TargetModel, recalibrate: bool = False) -> KernelPlan | None:
    """The kernel per linear shape and row count for this machine (None where only the default kernel exists)."""
    if not target.hardware.is_cpu:
        return None
    # keyed by every shape it plans for, the output layer's too where our forwards apply it (its packed kernel loses
    # to the default for 1-2 rows on some CPUs): a plan measured without it is never read for a target that has it
    linears = target.planned_linears()
    planned = json.dumps(sorted({shape_key(m) for m in linears}))
    plan = cached(machine_key(target, "kernels", planned), recalibrate, lambda: measure_plan(linears, target.hardware),
                  KernelPlan.from_dict, KernelPlan.to_dict, "the kernels per shape")
    return plan if plan.choices else None


def curve_rows(device_type: str) -> tuple[int, ...]:
    return GPU_CURVE_ROWS if device_type == "cuda" else CURVE_ROWS


@torch.inference_mode()
def measure_cost_curve(target: TargetModel, rows: tuple[int, ...] | None = None, context: int = CURVE_CONTEXT,
                       rounds: int = CURVE_ROUNDS) -> CostCurve:
    """Time one verify forward of k tokens (a chain: the mask does not change the cost) after `context` tokens, as
    greedy decoding runs it (the target's choices, not its logits: TargetModel.verify): `rounds` passes over every size
    after a warm-up pass, the median per size, fitted never to decrease."""
    rows = rows or curve_rows(target.device.type)
    context, medians = _verify_times(target, rows, context, rounds, {"": lambda: None})
    medians = tuple(medians[""])
    return CostCurve(tuple(rows), monotone_fit(medians), context, medians)


def _verify_times(target: TargetModel, rows: tuple[int, ...], context: int, rounds: int, ways: dict,
                  last=None) -> tuple[int, dict[str, list[float]]]:
    """The median seconds of a greedy verify of a chain of k tokens after `context` tokens, for each k of `rows` and
    each way of `ways` (a name and what sets it up before each verify): `rounds` interleaved passes over every size
    and way after a warm-up pass (a slow moment hits them all alike), each verify timed right after an untimed one of
    the same size and way. `last`, a test of one size's medians by way: the sizes are then timed one after another in
    the order given (each one's passes still interleaving the ways), up to the first that passes it, those after it
    not at all (a choice that ends there needs them not; on an AVX2 EPYC they were 70% of such a measurement). Returns
    the context used (clamped to the model's positions) and the medians by way, of the sizes timed."""
    context = min(context, target.max_positions - max(rows) - 1)
    cache = target.new_cache()
    ids = [i % target.vocab_size for i in range(100, 100 + context)]
    target.prefill(ids, cache)
    trees = [TokenTree.chain(ids[-1], ids[:k - 1]) for k in rows]
    times = {name: [[] for _ in rows] for name in ways}
    passes = range(rounds + 1)   # the first a warm-up
    order = [(r, i) for r in passes for i in range(len(rows))] if last is None else \
        [(r, i) for i in range(len(rows)) for r in passes]
    for round_, i in order:
        tree = trees[i]
        for name, set_up in ways.items():
            set_up()
            # timed as a run of steps of this size meets it: after one of its own, not after the previous size's
            # (a one-row verify right after one of 64 rows took 3.1-3.2 ms, after one-row verifies 2.5-2.7: EPYC
            # Zen 5, fp32)
            for timed in (False, True):
                t0 = time.perf_counter()
                target.verify(tree, cache, choices=True)
                if target.device.type == "cuda":
                    torch.cuda.synchronize()
                if round_ and timed:
                    times[name][i].append(time.perf_counter() - t0)
                target.rollback(cache, context)
        if last is not None and round_ == rounds and last({way: float(np.median(ts[i])) for way, ts in times.items()}):
            times = {way: ts[:i + 1] for way, ts in times.items()}
            break
    return context, {name: [float(np.median(t)) for t in ts] for name, ts in times.items()}


def _record(rows: tuple[int, ...], medians: dict[str, list[float]]) -> dict:
    """A measurement's record: the sizes timed (the first of `rows`, as many as the medians) and each way's medians."""
    timed = list(rows[:len(next(iter(medians.values())))])
    return {"rows": timed, **{way: [round(t, 6) for t in ts] for way, ts in medians.items()}}


def measuring_seconds(curve: CostCurve, rounds: int = CURVE_ROUNDS) -> float:
    """About what measure_cost_curve takes on the machine `curve` describes: two verifies of every size (one untimed)
    in each of its passes."""
    return 2 * (rounds + 1) * sum(curve.seconds)


def cost_curve(target: TargetModel, model_name: str, recalibrate: bool = False) -> CostCurve:
    """t(k) for the loaded model on this machine (measured with the kernels in use)."""
    kernels = json.dumps(target.fast_linears.plan.to_dict()["choices"], sort_keys=True) \
        if target.fast_linears is not None else ""
    # who applies the output layer too: ours (its kernel in the plan) or the model's own forward
    output = "own-output-layer" if target.own_output_layer else "model"
    name = machine_key(target, "cost", f"{model_name}|{target.num_layers}|{target.vocab_size}|{kernels}|{output}|"
                                       f"{CURVE_FIT}|{target.forward_kind}|{curve_rows(target.device.type)}|"
                                       f"copy {target.greedy_copy_rows}, tiles {target.greedy_copy_tile_rows}|"
                                       f"huge pages {target.huge_pages}|bf16 tiles {target.bf16_tiles}|"
                                       f"reading {target.reading}")
    return cached(name, recalibrate, lambda: measure_cost_curve(target), CostCurve.from_dict, CostCurve.to_dict,
                   "the verify cost curve")


@torch.inference_mode()
def measure_greedy_copy(target: TargetModel, rows: tuple[int, ...] = GREEDY_COPY_ROWS, context: int = CURVE_CONTEXT,
                        rounds: int = CURVE_ROUNDS) -> dict:
    """Seconds of a greedy verify of k tokens after `context` tokens with the output layer read whole ("full") and
    from its copy (dart_core.greedy_output) by fp32 FMAs ("copy") and, where it has one, by its integer product
    ("tiles": on AMX tiles or by VNNI), side by side: the median of `rounds` interleaved passes after a warm-up, up to
    the first size at which the copy is slower."""
    native = target.lean.native
    copy = native.greedy
    kept = native.greedy_rows, copy.tile_rows

    def serve(served: int, tile_rows: int | None = None):
        def set_up():
            native.greedy_rows, copy.tile_rows = served, tile_rows
        return set_up
    ways = {"full": serve(0), "copy": serve(native.max_rows)}
    if copy.tiles is not None:
        ways["tiles"] = serve(native.max_rows, 1)
    try:   # up to the first size at which the copy, by its faster way, is slower: copy_choice serves none past it
        _, medians = _verify_times(target, rows, context, rounds, ways,
                                   last=lambda t: min(t["copy"], t.get("tiles", t["copy"])) > t["full"])
    finally:
        native.greedy_rows, copy.tile_rows = kept
    return _record(rows, medians)


@dataclass(frozen=True)
class CopyChoice:
    """Where greedy steps read the output layer's copy: up to `rows` rows (0: never), by its integer product (on AMX
    tiles or by VNNI) from `tile_rows` rows (None: never)."""
    rows: int
    tile_rows: int | None = None


def copy_choice(record: dict) -> CopyChoice:
    """From a measure_greedy_copy record: the rows up to which the copy, by its faster way, was never slower than the
    full layer; and the rows from which its tiles were never slower than its FMAs."""
    best = [min(pair) for pair in zip(record["copy"], record.get("tiles", record["copy"]))]
    served = 0
    for k, full, copy in zip(record["rows"], record["full"], best):
        if copy > full:
            break
        served = k
    tile_rows = None
    if "tiles" in record:
        for k, fma, tiles in reversed(list(zip(record["rows"], record["copy"], record["tiles"]))):
            if tiles > fma:
                break
            tile_rows = k
    return CopyChoice(served, tile_rows)


def greedy_copy_choice(target: TargetModel, recalibrate: bool = False) -> CopyChoice | None:
    """Up to how many rows greedy steps read the output layer's copy here, and from how many by its integer product
    (measured once, cached); None where the C layer has no copy (no C layer, or an output bias)."""
    native = target.lean.native if target.lean is not None else None
    if native is None or native.greedy is None:
        return None
    copy = native.greedy
    name = machine_key(target, "greedy-copy", f"{copy.kind}|{copy.tiles_mode}|{target.vocab_size}|{GREEDY_COPY_ROWS}")
    return cached(name, recalibrate, lambda: measure_greedy_copy(target), copy_choice, lambda record: record,
                  "the output layer's copy for greedy steps")


@torch.inference_mode()
def measure_reading(target: TargetModel, rows: tuple[int, ...] = READING_ROWS, context: int = CURVE_CONTEXT,
                    rounds: int = READING_ROUNDS) -> dict:
    """Seconds of a greedy verify of k tokens after `context` tokens with the C layer's products reading their weights
    each way of READING_WAYS, side by side: the median of `rounds` interleaved passes after a warm-up, from the largest
    size down to the first at which the hardware won by READING_MARGIN (reading_of prefetches from none below it)."""
    kept = target.reading
    ways = {name: (lambda way=way: target.use_reading(way)) for name, way in READING_WAYS.items()}
    largest_first = tuple(sorted(rows, reverse=True))
    try:
        _, medians = _verify_times(target, largest_first, context, rounds, ways,
                                   last=lambda t: t["ahead"] > t["hardware"] * READING_MARGIN)
    finally:
        target.use_reading(kept)
    return {key: values[::-1] for key, values in _record(largest_first, medians).items()}   # in ascending rows


def reading_of(record: dict) -> Reading:
    """From a measure_reading record: prefetching ahead from the fewest rows from which leaving it to the hardware
    never won by READING_MARGIN (one more than the rows measured where the hardware won even at the most)."""
    start = record["rows"][-1] + 1
    for k, ahead, hardware in reversed(list(zip(record["rows"], record["ahead"], record["hardware"]))):
        if ahead > hardware * READING_MARGIN:
            break
        start = k
    return Reading(start)


def reading_choice(target: TargetModel, recalibrate: bool = False) -> Reading | None:
    """How the C layer's products read their weights here (measured once, cached); None where there is no C layer."""
    if target.reading is None:
        return None
    name = machine_key(target, "reading", f"{target.vocab_size}|{target.num_layers}|{READING_ROWS}|"
                                          f"{target.bf16_tiles}")
    return cached(name, recalibrate, lambda: measure_reading(target), reading_of, lambda record: record,
                  "how the products read the weights")


@torch.inference_mode()
def measure_q4_1(target: TargetModel, rows: tuple[int, ...] = Q4_1_ROWS, context: int = CURVE_CONTEXT,
                 rounds: int = CURVE_ROUNDS) -> dict:
    """Seconds of a greedy verify of k tokens after `context` tokens with the C layer reading the weights as Q4_1
    blocks ("blocks") and in fp32 ("fp32"), side by side: the median of `rounds` interleaved passes after a warm-up, up
    to the first size at which the blocks are slower."""
    native = target.lean.native
    kept = native.q4_rows

    def serve(rows_: int):
        def set_up():
            native.q4_rows = rows_
        return set_up
    try:   # up to the first size at which the blocks are slower: q4_1_rows_of serves none past it
        _, medians = _verify_times(target, rows, context, rounds, {"fp32": serve(0), "blocks": serve(native.max_rows)},
                                   last=lambda t: t["blocks"] > t["fp32"])
    finally:
        native.q4_rows = kept
    return _record(rows, medians)


def q4_1_rows_of(record: dict) -> int:
    """From a measure_q4_1 record: the rows up to which the blocks were never slower than the fp32 packing."""
    served = 0
    for k, fp32, blocks in zip(record["rows"], record["fp32"], record["blocks"]):
        if blocks > fp32:
            break
        served = k
    return served


def q4_1_choice(target: TargetModel, recalibrate: bool = False) -> int | None:
    """Up to how many rows the C layer reads a model's Q4_1 blocks here (measured once, cached); None where it has
    none (no C layer, or weights that are not such blocks)."""
    native = target.lean.native if target.lean is not None else None
    if native is None or native.q4_layers is None:
        return None
    name = machine_key(target, "q4-1", f"{target.vocab_size}|{target.num_layers}|{Q4_1_ROWS}")
    return cached(name, recalibrate, lambda: measure_q4_1(target), q4_1_rows_of, lambda record: record,
                  "where the weights' Q4_1 blocks are read")


@torch.inference_mode()
def measure_prefill(target: TargetModel, rows: tuple[int, ...] = PREFILL_ROWS,
                    rounds: int = PREFILL_ROUNDS) -> dict:
    """Seconds of a prefill of k tokens through the C layer (its rows at a time) and through the lean forward's torch
    step, side by side: the best of `rounds` interleaved passes after a warm-up."""
    native = target.lean.native
    kept = native.prefill_rows
    ways = {"C layer": None, "torch": native.max_rows}
    rows = tuple(sorted({min(k, target.max_positions - 1) for k in rows}))   # a model of few positions: its longest
    times = {way: [float("inf")] * len(rows) for way in ways}
    try:
        for round_ in range(rounds + 1):   # the first pass is a warm-up
            for i, k in enumerate(rows):
                for way, prefill_rows in ways.items():
                    native.prefill_rows = prefill_rows
                    cache = target.new_cache(k)
                    t0 = time.perf_counter()
                    target.prefill([token % target.vocab_size for token in range(100, 100 + k)], cache)
                    if round_:
                        times[way][i] = min(times[way][i], time.perf_counter() - t0)
                    target.release(cache)
    finally:
        native.prefill_rows = kept
    return {"rows": list(rows), **{way: [round(t, 6) for t in ts] for way, ts in times.items()}}


@dataclass(frozen=True)
class PrefillChoice:
    """The prompts the C layer prefills, its rows at a time: up to `rows` tokens (0: none longer than its rows; None:
    any length)."""
    rows: int | None


def prefill_of(record: dict) -> PrefillChoice:
    """From a measure_prefill record: prompts up to the longest length at which the C layer was faster than torch's
    step, and at every shorter one; any length where it was faster at every length measured (on an EPYC Zen 5 its lead
    held up to 2,048 tokens: docs/cpu-speed.md, section 21)."""
    served = 0
    for k, ours, theirs in zip(record["rows"], record["C layer"], record["torch"]):
        if ours > theirs:
            return PrefillChoice(served)
        served = k
    return PrefillChoice(None)


def prefill_choice(target: TargetModel, recalibrate: bool = False) -> PrefillChoice | None:
    """The prompts the C layer prefills here (measured once, cached); None where there is no C layer."""
    native = target.lean.native if target.lean is not None else None
    if native is None:
        return None
    name = machine_key(target, "prefill", f"{target.vocab_size}|{target.num_layers}|{PREFILL_ROWS}|"
                                          f"{target.bf16_tiles}|{native.max_rows}")
    return cached(name, recalibrate, lambda: measure_prefill(target), prefill_of, lambda record: record,
                  "where prompts are prefilled")


def _one_token_forward(target: TargetModel):
    """A plain decoding step of the target, as decoding runs one between two drafting steps: it streams the target's
    weights through the caches, so the head's are timed from where decoding finds them (timed warm, int8 weights
    seemed within a tenth of bf16 on the AMX Xeon; after a forward, as inside decoding, they save a sixth)."""
    prompt = list(range(1, 17))
    cache = target.new_cache(len(prompt) + 1)
    target.prefill(prompt, cache)

    def forward():
        target.verify(TokenTree([1], [-1]), cache, choices=True)
        target.rollback(cache, len(prompt))
    return forward


def machine_record(target: TargetModel, model_name: str, with_curve: bool = False,
                   draft_kernels: DraftKernelChoice | None = None) -> MachineRecord:
    """Where a run ran, as traces and the bench report record it: the hardware, the kernels in use, (with_curve)
    the verify cost curve measured on it, and (draft_kernels) how DART's head drafts there."""
    reading = target.reading
    return MachineRecord(target.hardware, target.hardware.describe(),
                         target.fast_linears.summary() if target.fast_linears is not None else None,
                         dtype_spelling(target.dtype), target.dtype_choice,
                         cost_curve(target, model_name) if with_curve else None, draft_kernels,
                         target.forward_kind, target.greedy_copy_rows, target.greedy_copy_tile_rows,
                         target.huge_pages, target.greedy_copy_tiles, target.bf16_tiles,
                         reading.prefetch_from if reading else None, prefill=target.prefill_reach,
                         q4_1_rows=target.q4_1_rows)


INT8_MARGIN = 0.9      # int8 weights (whose rows differ a little) must take at most this share of the others' best


def draft_kernel_choice(head, target: TargetModel, mode: str = AUTO_KERNELS,
                        recalibrate: bool = False) -> DraftKernelChoice:
    """How DART's head drafts here (DRAFT_KERNELS): as `mode` asks, or for 'auto' the fastest of those that can run
    (one drafting step of each, cached per machine and head shapes), and why; when measured, with the seconds of
    each."""
    if mode not in DRAFT_KERNEL_MODES:
        raise ConfigError(f"--draft-kernels takes {', '.join(DRAFT_KERNEL_MODES)}, got {mode!r}")
    hw = target.hardware
    native = draft_native.unsupported(head, hw)
    why_not = {NATIVE_KERNELS: native, NATIVE_INT8_KERNELS: native, INT8_KERNELS: int8_supported(hw, head),
               FP32_KERNELS: None}
    if mode != AUTO_KERNELS:
        if why_not[mode] is not None:
            raise ConfigError(f"--draft-kernels {mode}: {why_not[mode]}")
        return DraftKernelChoice(mode, f"{mode} (--draft-kernels {mode})")
    runs = [kernels for kernels in DRAFT_KERNELS if why_not[kernels] is None]
    if runs == [FP32_KERNELS]:
        return DraftKernelChoice(FP32_KERNELS, f"fp32: {why_not[NATIVE_KERNELS]}; int8: {why_not[INT8_KERNELS]}")
    c = head.config
    name = _file_name("draft-kernels", hw, [c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads,
                                             c.head_dim, c.out_vocab, c.n_mask, head.lm_head is None, *runs,
                                             "after a target forward"])

    def measure():
        out_weight = None if head.lm_head is not None else torch.randn(c.out_vocab, c.hidden_size)
        forward = _one_token_forward(target)
        steps = {FP32_KERNELS: lambda: head_step(head, out_weight, packed_linear(head.lm_head, hw)
                                                 if onednn_applies(head.lm_head, hw) else None),
                 INT8_KERNELS: lambda: head_step(int8_copy(head), out_weight),
                 **{kernels: lambda weights=weights: native_step(draft_native.packed(head, hw, out_weight, weights))
                    for kernels, weights in draft_native.WEIGHTS.items()}}
        return {kernels: time_drafting(*steps[kernels](), c, before=forward) for kernels in runs}

    def read(seconds):
        best = min(seconds, key=seconds.get)
        exact = [k for k in seconds if k not in ROUNDED_KERNELS]
        if best in ROUNDED_KERNELS and seconds[best] > INT8_MARGIN * min(seconds[k] for k in exact):
            best = min(exact, key=seconds.get)
        said = ", ".join(f"{seconds[k] * 1e3:.1f} ms {KERNEL_WORDS[k]}" for k in DRAFT_KERNELS if k in seconds)
        return DraftKernelChoice(best, f"{best}: the fastest here, a drafting step {said}", seconds)
    return cached(name, recalibrate, measure, read, lambda seconds: seconds, "the draft head's kernels")
