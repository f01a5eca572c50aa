"""Turning user-level names ("default", a folder, "random", "none") into a target, a draft head, an n-gram table and
proposers; and the one place a run's settings are written into its trace.

The CLI, the benchmark and the app all build their decoding pieces here, so they behave the same.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ..acceptance import SamplingConfig
from ..budget.auto import RECHOOSE_EVERY, AutoBudget, max_budget_for
from ..draft_head import DraftConfig, DraftHead, DraftHeadError
from ..context_ngram import ContextNGram
from ..errors import DartError
from ..machine.hardware import Hardware, detect
from ..formats.head_formats import head_folder, load_head
from ..machine.kernels import DTYPE_ROWS
from ..machine.records import DraftKernelChoice
from ..methods import DART_PLD, METHODS, PLD, VANILLA, uses_head
from ..ngram import NGramError, NGramModel
from ..formats.ngram_trie import read_trie
from ..proposers import DartProposer, HeadDrafter, PromptLookupProposer, Proposer, VanillaProposer
from ..target import TargetModel
from ..trace import RunSettings, Trace
from ..tree_search import SearchConfig
from .calibration import (cost_curve, draft_kernel_choice, greedy_copy_choice, kernel_plan, machine_record,
                          measuring_seconds, prefill_choice, q4_1_choice, reading_choice)
from .dtype_choice import AUTO, FAST, DtypeChoice, choose_cpu_dtype, choose_gpu_dtype, lossless_choice
from .defaults import DEFAULT_HEAD, END_OF_TURN, LOOKUP_LONGEST, LOOKUP_TOKENS, PLD_NGRAM, PLD_TOKENS
from .hub import fetch, is_hub_id
from .models import DEFAULT_MODEL, ModelLoadError, dtype_name, load_model_and_tokenizer, parse_dtype
from .ngram_tables import ensure_default_ngram


LEAN, LEAN_EAGER, TRANSFORMERS = "lean", "lean-eager", "transformers"   # lean-eager: no CUDA graphs
FORWARDS = (LEAN, LEAN_EAGER, TRANSFORMERS)
FORWARD_ENV = "DART_FORWARD"   # the one switch back to transformers' own forward, for every command and the app


class SetupError(DartError):
    """Pieces that do not fit together (a table for another vocabulary, DART without a head, ...)."""


def load_target(model: str = DEFAULT_MODEL, device: str = "cpu", dtype: str = AUTO,
                recalibrate: bool = False, hardware: Hardware | None = None,
                rows_measured: tuple[int, ...] = DTYPE_ROWS, forward: str | None = None) -> TargetModel:
    """The target, with its decoder linears on the kernels measured fastest on this machine (cached per machine;
    recalibrate measures again). dtype 'auto': lossless fp32; 'fast': the dtype measured fastest here (see
    dart_core.setup.dtype_choice); the choice and its reason are in `target.dtype_choice`. hardware: what the
    kernels may use (default: what this machine has; tests turn capabilities on and off). rows_measured: where
    'fast' compares the dtypes on a CPU (kernels.DTYPE_ROWS for decoding, BATCH_ROWS for batched work). forward:
    'lean' (our forward over a static cache where the model's family allows, its steps captured as CUDA graphs on a
    GPU and run by our C layer on a CPU in fp32), 'lean-eager' (the same as torch operations) or 'transformers'; None
    reads $DART_FORWARD, 'lean' by default."""
    forward = chosen_forward(forward)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} asked for, but CUDA is not available here")
    # auto is lossless (fp32); fast is decided before the load on a GPU, measured on the fp32 model on a CPU
    choice = lossless_choice() if dtype == AUTO else choose_gpu_dtype(device) \
        if dtype == FAST and device.startswith("cuda") else None
    load_as = choice.dtype if choice else "fp32" if dtype == FAST else dtype
    parse_dtype(load_as)  # a clear error before the slow load
    hf_model, tokenizer = load_model_and_tokenizer(model, device=device, dtype=load_as)
    if dtype == FAST and choice is None:
        choice = choose_cpu_dtype(hf_model, hardware or detect(device), recalibrate, rows_measured,
                                  native=forward == LEAN)
        hf_model.to(parse_dtype(choice.dtype))
    target = TargetModel(hf_model, tokenizer, hardware)
    target.dtype_choice = choice
    target.use_lean(forward != TRANSFORMERS, graphs=forward == LEAN)
    target.use_kernels(kernel_plan(target, recalibrate))
    choice = greedy_copy_choice(target, recalibrate)
    if choice is not None:
        target.use_greedy_copy(choice.rows, choice.tile_rows)
    q4_rows = q4_1_choice(target, recalibrate)
    if q4_rows is not None:
        target.use_q4_1(q4_rows)
    reading = reading_choice(target, recalibrate)
    if reading is not None:
        target.use_reading(reading)
    prefill = prefill_choice(target, recalibrate)
    if prefill is not None:
        target.use_prefill(prefill.rows)
    return target


def chosen_forward(forward: str | None) -> str:
    """The forward asked for (None: $DART_FORWARD, else 'lean'), checked."""
    forward = forward or os.environ.get(FORWARD_ENV) or LEAN
    if forward not in FORWARDS:
        raise SetupError(f"unknown forward {forward!r} (from {FORWARD_ENV} or the caller); use one of "
                         f"{', '.join(FORWARDS)}")
    return forward


def fast_dtype(model: str, device: str, recalibrate: bool = False) -> tuple[DtypeChoice, TargetModel | None]:
    """`fast` for a model not loaded yet (the bench, deciding its dtype list), and on a CPU the fp32 target it was
    measured on, so that the caller decodes fp32 with it instead of loading the model again (None on a GPU)."""
    if device.startswith("cuda"):
        return choose_gpu_dtype(device), None
    target = load_target(model, device, "fp32", recalibrate)
    return choose_cpu_dtype(target.model, target.hardware, native=target.forward_kind == "lean-native"), target


def stop_ids(target: TargetModel) -> frozenset[int]:
    """The target's end-of-sequence and end-of-turn ids. Reading them walks the whole vocabulary, so they are read
    once per target and tokenizer (every proposer and trace of a run asks)."""
    known = _STOP_IDS.get(target)
    if known is not None and known[0] is target.tokenizer:
        return known[1]
    ids = _read_stop_ids(target)
    _STOP_IDS[target] = (target.tokenizer, ids)
    return ids


_STOP_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _read_stop_ids(target: TargetModel) -> frozenset[int]:
    ids: set[int] = set()
    eos = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    for value in (eos, target.config.eos_token_id, getattr(target.tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    tok = target.tokenizer
    if tok is not None:
        vocab = tok.get_vocab()
        ids.update(vocab[t] for t in END_OF_TURN if t in vocab)
    return frozenset(ids)


def load_draft(spec: str | None, target: TargetModel, n_mask: int = 4, seed: int = 0) -> DraftHead:
    """'default' -> the shipped head; 'random' -> a seeded untrained head; else a head folder (ours or the
    authors')."""
    if spec in (None, "", "default"):
        if not (DEFAULT_HEAD / "config.json").is_file():
            raise DraftHeadError(f"no trained head shipped at {DEFAULT_HEAD}; pass --draft random or a head folder")
        spec = str(DEFAULT_HEAD)
    if is_hub_id(spec):
        spec = str(fetch(spec, "draft head"))
    if spec == "random":
        head = DraftHead.random(DraftConfig.for_target(target.config, n_mask=n_mask), seed=seed)
    else:
        head = load_head(spec)
    head.check_target(target)
    return head.to(device=target.device, dtype=target.dtype)


def check_local_names(draft: str | None, ngram: str | None) -> None:
    """Raise the error load_draft or load_ngram would, where `draft` or `ngram` names a path here that is missing."""
    if draft not in (None, "", "default", "random") and not is_hub_id(draft):
        head_folder(draft)
    if ngram not in (None, "", "none", "default") and not is_hub_id(ngram) and not os.path.isfile(ngram):
        raise NGramError.not_found(ngram)


def load_ngram(spec: str | None, vocab_size: int | None = None) -> NGramModel | None:
    """'none' -> no n-gram term; 'default' -> the default model's table (shipped, cached, or built once);
    else an .npz file, or a .trie file of the DART authors (which has no vocabulary size: give the target's), or
    a hub file as repo:file."""
    if spec in (None, "", "none"):
        return None
    if spec == "default":
        return NGramModel.load(ensure_default_ngram())
    if is_hub_id(spec):
        spec = str(fetch(spec, "n-gram table"))
    if str(spec).endswith(".trie"):
        return read_trie(spec, vocab_size=vocab_size)
    return NGramModel.load(spec)


def check_ngram_fits(table, target: TargetModel) -> None:
    if table is not None and table.vocab_size != target.vocab_size:
        raise SetupError(f"the n-gram table has a vocabulary of {table.vocab_size}, the target {target.vocab_size}")


@dataclass(frozen=True)
class DraftSettings:
    """How the drafting methods draft: DART's tree search and its knobs, and prompt lookup's. A method reads what is
    its own (vanilla nothing, pld the pld_ fields) and ignores the rest."""
    search: SearchConfig = field(default_factory=SearchConfig)
    auto_budget: bool = False           # DART's node budget chosen as the run goes (search.node_budget: its start)
    rechoose_every: int = RECHOOSE_EVERY   # verify steps between two choices of the automatic budget
    lookup_tokens: int | None = None    # dart_pld's branch length (None: chosen by the automatic budget, else default)
    context_weight: float = 0.0         # > 0: the prompt's and the output's own n-grams join the table (ContextNGram)
    pld_tokens: int = PLD_TOKENS        # prompt lookup: tokens copied
    pld_ngram: int = PLD_NGRAM          # prompt lookup (and dart_pld's branch): the longest n-gram matched
    record_candidates: bool = True      # DART's steps keep every candidate the search weighed (off: the tree only)


def looked_up_tokens(method: str, lookup_tokens: int | None, auto: bool) -> int | None:
    """dart_pld's branch as the proposer looks it up: the length asked for; else, with the automatic node budget,
    the longest it may choose (each step records the length it grafted, as budget["lookup"]); else the default."""
    if method != DART_PLD:
        return None
    return lookup_tokens or (LOOKUP_LONGEST if auto else LOOKUP_TOKENS)


def auto_budget(target: TargetModel, model_name: str, settings: DraftSettings, recalibrate: bool = False) -> AutoBudget:
    """A node budget chosen as the run goes, on this machine's measured verify cost curve (measured once, cached;
    measured again if the run's own verify times disagree with it), starting from search.node_budget."""
    return AutoBudget(cost_curve(target, model_name, recalibrate), start=settings.search.node_budget,
                      max_budget=max_budget_for(target.device.type),
                      remeasure=lambda: cost_curve(target, model_name, recalibrate=True),
                      remeasure_cost=measuring_seconds, rechoose_every=settings.rechoose_every)


@dataclass
class Loaded:
    """A target with the draft head and n-gram table DART needs (None where not loaded), the names they were loaded
    by, and the target's stop ids. The one place proposers and traces are made, for the CLI, the bench and the app."""
    target: TargetModel
    head: DraftHead | None = None
    table: NGramModel | None = None
    model: str = "default"
    draft: str | None = None
    ngram: str | None = None
    device: str = "cpu"
    dtype: str = "fp32"
    draft_kernels: str = "auto"       # how DART's head drafts: 'auto', 'native', 'int8' or 'fp32' (calibration)
    fell_back: bool = False           # no trained head was shipped: a random one stands in (load's random_fallback)

    @property
    def stop_ids(self) -> frozenset[int]:
        return stop_ids(self.target)

    @cached_property
    def draft_choice(self) -> DraftKernelChoice | None:
        """Whether the head drafts in int8 here, and why (None without a head)."""
        return draft_kernel_choice(self.head, self.target, self.draft_kernels) if self.head is not None else None

    def proposer(self, method: str, settings: DraftSettings | None = None, recalibrate: bool = False) -> Proposer:
        """The proposer of `method` with these settings; recalibrate measures the cost curve of the automatic
        budget again."""
        settings = settings or DraftSettings()
        if method == VANILLA:
            return VanillaProposer()
        if method == PLD:
            return PromptLookupProposer(max_ngram=settings.pld_ngram, num_tokens=settings.pld_tokens)
        if not uses_head(method):
            raise SetupError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
        if self.head is None:
            raise SetupError("DART needs a draft head")
        check_ngram_fits(self.table, self.target)
        auto = settings.auto_budget
        budget = auto_budget(self.target, self.model, settings, recalibrate) if auto else None
        table = ContextNGram(self.table, weight=settings.context_weight) if settings.context_weight > 0 \
            else self.table
        lookup = None
        if method == DART_PLD:
            if budget is not None and settings.lookup_tokens is None:   # its length is chosen with the budget
                budget.choose_lookup(range(LOOKUP_LONGEST + 1), start=LOOKUP_TOKENS)
            lookup = PromptLookupProposer(max_ngram=settings.pld_ngram,
                                          num_tokens=looked_up_tokens(method, settings.lookup_tokens, auto))
        drafter = HeadDrafter(self.head, self.target, self.draft_choice.kernels)
        return DartProposer(drafter, settings.search, table, eos_ids=self.stop_ids, lookup=lookup, auto_budget=budget,
                            record_candidates=settings.record_candidates)

    def new_trace(self, method: str, prompt_ids: list[int], prompt_text: str, sampling: SamplingConfig,
                  max_new_tokens: int, settings: DraftSettings | None = None) -> Trace:
        """An empty trace of a run of `method` with these settings: what every trace records of how it was made."""
        settings = settings or DraftSettings()
        head, auto = uses_head(method), settings.auto_budget and uses_head(method)
        run = RunSettings(
            model=self.model, draft=self.draft if head else None, ngram=self.ngram if head else None,
            device=self.device, dtype=self.dtype, sampling=sampling, search=settings.search if head else None,
            max_new_tokens=max_new_tokens, stop_ids=sorted(self.stop_ids),
            lookup_tokens=looked_up_tokens(method, settings.lookup_tokens, auto),
            ngram_context_weight=settings.context_weight if head else 0.0, auto_budget=auto,
            machine=machine_record(self.target, self.model, auto, self.draft_choice if head else None))
        trace = Trace(method=method, prompt_ids=list(prompt_ids), prompt_text=prompt_text, settings=run)
        trace.name_tokens(self.target.tokenizer, prompt_ids)
        return trace


def load(model: str = DEFAULT_MODEL, draft: str | None = "default", ngram: str | None = "default",
         device: str = "cpu", dtype: str = AUTO, with_head: bool = True, recalibrate: bool = False,
         draft_kernels: str = "auto", random_fallback: bool = False, target: TargetModel | None = None) -> Loaded:
    """Load the target and, with_head, the draft head and the n-gram table, all by name. random_fallback: when the
    default head is not shipped, a random (untrained) head stands in (`fell_back`) rather than an error (the app
    shows its pages anyway). target: one already loaded in `dtype` (only the head and the table are loaded)."""
    if with_head:
        check_local_names(draft, ngram)   # a mistyped path says so before the target loads (a minute the first time)
    target = target or load_target(model, device, dtype, recalibrate)
    dtype = dtype_name(target.dtype)
    if not with_head:
        return Loaded(target, model=model, device=device, dtype=dtype)
    fell_back = False
    try:
        head = load_draft(draft, target)
    except DraftHeadError:
        if not random_fallback or draft not in (None, "", "default"):
            raise
        draft, head, fell_back = "random", load_draft("random", target), True
    table = load_ngram(ngram, target.vocab_size)
    check_ngram_fits(table, target)
    if recalibrate and head is not None:   # measured again now; Loaded.draft_choice reads it back
        draft_kernel_choice(head, target, draft_kernels, recalibrate=True)
    return Loaded(target, head, table, model, draft, ngram, device, dtype, draft_kernels, fell_back)
