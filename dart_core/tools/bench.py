"""The benchmark: `python -m dart_core bench ...`.

Every method decodes every prompt in the same run, methods alternating per prompt (the order rotates from prompt
to prompt) so that drift in machine speed falls on all of them alike. The target is loaded once per dtype.

Methods:
  hf_generate  transformers `model.generate` (plain decoding): the speed yardstick
  vanilla      our decoding loop with no drafts (one token per target forward)
  hf_pld       transformers' built-in prompt lookup (`generate(..., prompt_lookup_num_tokens=N)`)
  pld          our prompt-lookup proposer
  dart         DART (draft head + n-gram-guided tree search)

Definitions (per method, dtype, temperature and workload, summed over its prompts):
  tokens_per_s  new tokens / decode wall time. The clock runs around the whole decode call of each prompt (prefill
                included, prompt tokenization excluded), the same for every method.
  speedup       tokens_per_s / tokens_per_s of hf_generate in the same dtype (and temperature, workload).
                speedup_vs_hf_fp32 divides by hf_generate in fp32, speedup_vs_hf_best by hf_generate in its faster
                dtype.
  tau           ours: tokens emitted per verify step (dart_core.metrics). hf_*: new tokens / target forward passes
                (counted with a forward hook on the model), so plain decoding gives 1.0 for both.
  tokens_per_forward  new tokens / target forward passes, the prefill included, for every method alike (the
                apples-to-apples figure between hf_pld and pld; hf_pld may already accept drafts in its prefill).
  identical     greedy only: outputs token-identical to the reference plain decoding in the same dtype (hf_generate
                when it runs, else vanilla); every divergence is listed with its first differing position.
Outputs are cut after the first stop token for every method before they are counted or compared.

Resuming: each finished run is appended as one JSON line to `<out>.runs.jsonl` next to the report (the runs file,
flushed line by line; its first line holds the settings that change outputs or speed). `--resume` reads it back:
runs found there are not run again, a dtype with nothing left is not even loaded, and the report is built from the
old and new runs together. Resuming with other settings is an error; without --resume the runs file starts afresh.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from ..acceptance import SamplingConfig, is_greedy
from ..decoding import GenerationConfig, cut_at_stop, generate
from ..metrics import Metrics
from ..setup.chat import encode_prompt
from ..setup.datasets import WORKLOADS, read_prompt_file
from ..setup.defaults import DEFAULT_HEAD
from ..setup.files import check_writable
from ..setup.loading import load_target, make_proposer, stop_ids
from ..setup.ngram_tables import ensure_default_ngram
from .args import CliError, add_model_args, add_search_args, search_config_from

BENCH_FORMAT = "dart-lab-bench/1"
RUNS_FORMAT = "dart-lab-bench-runs/1"
METHODS = ("hf_generate", "vanilla", "hf_pld", "pld", "dart", "dart_pld")
HF_METHODS = ("hf_generate", "hf_pld")
PLAIN = ("hf_generate", "vanilla")        # reference plain decoding, in order of preference
DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
               "float16": "fp16"}
ALL = "all"
PHASES = ("draft", "search", "verify", "accept")
WARMUP_TOKENS = 16                        # the untimed warm-up decodes are short


# ---------------------------------------------------------------------------------------------------- options
def _split(value: str) -> list[str]:
    return [v.strip() for v in str(value or "").split(",") if v.strip()]


def parse_methods(value: str) -> list[str]:
    methods = _split(value)
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise CliError(f"unknown method(s) {', '.join(bad) or '(none)'}; use a comma list of {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


def parse_dtypes(value: str) -> list[str]:
    dtypes = []
    for d in _split(value):
        if d not in DTYPE_NAMES:
            raise CliError(f"unknown dtype {d!r}; use a comma list of fp32, bf16, fp16")
        dtypes.append(DTYPE_NAMES[d])
    if not dtypes:
        raise CliError("--dtype is empty")
    return list(dict.fromkeys(dtypes))


def parse_temperatures(value: str) -> list[float]:
    temps = []
    for t in _split(value):
        try:
            x = float(t)
        except ValueError:
            raise CliError(f"bad temperature {t!r}; use a comma list of numbers (0 = greedy)") from None
        if not x >= 0:
            raise CliError(f"temperature must be >= 0, got {t}")
        temps.append(x)
    if not temps:
        raise CliError("--temperature is empty")
    return list(dict.fromkeys(temps))


# ---------------------------------------------------------------------------------------------------- prompts
@dataclass
class BenchPrompt:
    id: str
    workload: str
    text: str
    raw: bool = False
    ids: list[int] = field(default_factory=list)
    index: int = 0                         # position in its workload (before --limit cuts it)


def load_prompts(workloads: list[str], prompt_file: str | None, limit: int | None) -> tuple[list[BenchPrompt], dict]:
    """Prompts of each workload (at most `limit` each), and a per-workload summary (counts, skipped lines)."""

    prompts: list[BenchPrompt] = []
    info: dict[str, dict] = {}
    for name in workloads:
        if name not in WORKLOADS:
            raise CliError(f"unknown workload {name!r}; use a comma list of {', '.join(WORKLOADS)}")
        items = WORKLOADS[name]()[:limit]
        prompts += [BenchPrompt(p.id, name, p.text, p.raw, index=i) for i, p in enumerate(items)]
        info[name] = {"prompts": len(items), "skipped": 0}
    if prompt_file:
        pf = read_prompt_file(prompt_file)
        name = Path(prompt_file).stem or "prompts"
        if name in info or name == ALL:
            name = f"file:{name}"
        items = pf.prompts[:limit]
        prompts += [BenchPrompt(p.id, name, p.text, p.raw, index=i) for i, p in enumerate(items)]
        info[name] = {"prompts": len(items), "skipped": len(pf.skipped), "skipped_reasons": pf.skipped[:50],
                      "file": str(prompt_file)}
        if pf.skipped:
            print(f"[bench] {prompt_file}: skipped {len(pf.skipped)} bad line(s), e.g. {pf.skipped[0]}",
                  file=sys.stderr)
    return prompts, info


# ---------------------------------------------------------------------------------------------------- results
@dataclass
class Run:
    prompt: BenchPrompt
    method: str
    dtype: str
    temperature: float
    output: list[int]
    seconds: float
    forwards: int | None = None        # hf methods: target forward passes
    metrics: object | None = None      # ours: dart_core.metrics.Metrics of this prompt
    stop: str | None = None
    first_diff: int | None = None      # greedy: first position differing from the reference (None: identical)
    reference: str | None = None
    seed: int | None = None


@dataclass
class Cell:
    """The totals of one (method, dtype, temperature, workload)."""
    method: str
    dtype: str
    temperature: float
    workload: str
    prompts: int = 0
    tokens: int = 0
    seconds: float = 0.0
    forwards: int = 0
    metrics: object | None = None
    compared: int = 0
    identical: int = 0
    identical_vs: dict = field(default_factory=dict)  # plain method -> [identical, compared]
    reference: str | None = None
    divergences: list = field(default_factory=list)

    def add(self, run: Run, cmp_all: dict[str, int | None]) -> None:

        self.prompts += 1
        self.tokens += len(run.output)
        self.seconds += run.seconds
        self.forwards += run.forwards or 0
        if run.metrics is not None:
            if self.metrics is None:
                self.metrics = Metrics()
            self.metrics.merge(run.metrics)
        if run.reference is not None:
            self.reference = run.reference
            self.compared += 1
            if run.first_diff is None:
                self.identical += 1
            else:
                self.divergences.append({"prompt": run.prompt.id, "position": run.first_diff,
                                         "reference": run.reference})
        for ref, diff in cmp_all.items():
            entry = self.identical_vs.setdefault(ref, [0, 0])
            entry[1] += 1
            entry[0] += diff is None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def tau(self) -> float | None:
        if self.method in HF_METHODS:
            return self.tokens / self.forwards if self.forwards else None
        return self.metrics.tau if self.metrics is not None else None

    def to_dict(self) -> dict:
        m = self.metrics
        share = None
        if m is not None:
            total = sum(m.phase_time.get(p, 0.0) for p in PHASES)
            share = {p: round(m.phase_time.get(p, 0.0) / total, 4) if total else 0.0 for p in PHASES}
        greedy = self.reference is not None
        tau = self.tau()
        forwards = None
        if self.method in HF_METHODS:
            forwards = self.forwards
        elif m is not None:
            forwards = m.verify_steps + self.prompts          # + one prefill forward a prompt
        return {
            "method": self.method, "dtype": self.dtype, "temperature": self.temperature, "workload": self.workload,
            "prompts": self.prompts, "new_tokens": self.tokens, "seconds": round(self.seconds, 4),
            "tokens_per_s": round(self.tokens_per_s, 3), "speedup": None, "speedup_vs_hf_fp32": None,
            "speedup_vs_hf_best": None,
            "tau": None if tau is None else round(tau, 4),
            "forward_passes": forwards,
            "tokens_per_forward": round(self.tokens / forwards, 4) if forwards else None,
            "acceptance_by_depth": None if m is None else [round(x, 4) for x in m.acceptance_by_depth],
            "accepted_hist": None if m is None else list(m.accepted_hist),
            "phase_share": share,
            "phase_time": None if m is None else {k: round(v, 4) for k, v in m.phase_time.items()},
            "identical": self.identical if greedy else None,
            "compared": self.compared if greedy else None,
            "reference": self.reference,
            "identical_vs": {k: {"identical": v[0], "compared": v[1]} for k, v in self.identical_vs.items()}
            if greedy else None,
            "divergences": self.divergences if greedy else None,
        }


def first_difference(a: list[int], b: list[int]) -> int | None:
    """First position where two outputs differ (the shorter length if one is a prefix of the other), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---------------------------------------------------------------------------------------------------- the runs file
IDENT_KEYS = ("workload", "index", "id", "raw", "sha256")


def runs_path(out_path) -> Path:
    """The runs file next to the report: runs/bench.json -> runs/bench.runs.jsonl."""
    return Path(out_path).with_suffix(".runs.jsonl")


def prompt_ident(p: BenchPrompt) -> dict:
    """What makes a prompt the same one in a later session: workload, place and id, and its exact text."""
    return {"workload": p.workload, "index": p.index, "id": p.id, "raw": p.raw,
            "sha256": hashlib.sha256(p.text.encode("utf-8")).hexdigest()[:16]}


def ident_tuple(ident: dict) -> tuple:
    return tuple(ident[k] for k in IDENT_KEYS)


def run_key(ident: dict, dtype: str, temperature: float, method: str, seed: int | None) -> tuple:
    # greedy decoding ignores the seed; a sampled run depends on it (it follows the prompt's place in the set)
    return (dtype, float(temperature), method, None if is_greedy(temperature) else seed, *ident_tuple(ident))


def key_of(run: Run) -> tuple:
    return run_key(prompt_ident(run.prompt), run.dtype, run.temperature, run.method, run.seed)


def run_to_dict(run: Run) -> dict:
    """A run as one runs-file record. Its reference and first difference are left out: they are derived from all
    the runs of its prompt when the report is built."""
    return {"prompt": {**prompt_ident(run.prompt), "ids": list(run.prompt.ids)}, "method": run.method,
            "dtype": run.dtype, "temperature": run.temperature, "seed": run.seed, "output": list(run.output),
            "seconds": run.seconds, "forwards": run.forwards, "stop": run.stop,
            "metrics": None if run.metrics is None else asdict(run.metrics)}


def run_from_dict(d: dict, prompt: BenchPrompt) -> Run:
    """The run of a runs-file record, attached to `prompt` (the same prompt of this session)."""

    m = d["metrics"]
    return Run(prompt, d["method"], d["dtype"], d["temperature"], list(d["output"]), d["seconds"],
               forwards=d["forwards"], metrics=None if m is None else Metrics(**m), stop=d["stop"], seed=d["seed"])


def resume_settings(args, ngram: str, search_cfg) -> dict:
    """What a resumed benchmark must share with the runs it continues: everything that changes outputs or speed.
    Methods, dtypes, temperatures and prompts may differ: runs are matched one by one."""


    return {"model": args.model, "draft": args.draft, "ngram": ngram, "device": args.device,
            "max_new_tokens": args.max_new_tokens, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed,
            "pld_tokens": args.pld_tokens, "pld_ngram": args.pld_ngram,
            "lookup_tokens": getattr(args, "lookup_tokens", None),
            "ngram_context_weight": args.ngram_context_weight, "search": search_cfg.to_dict(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
            # a head or table rebuilt in place keeps its name: compare the bytes
            "draft_sha256": _files_digest(DEFAULT_HEAD if args.draft == "default" else args.draft),
            "ngram_sha256": _files_digest(ngram)}


def _files_digest(path) -> str | None:
    """sha256 over a file or a folder's files; None for a name that is no path ('random', 'none', 'default')."""
    if not path or str(path) in ("none", "random", "default"):
        return None
    path = Path(path)
    if not path.exists():
        return None
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(path).as_posix().encode() if f != path else b"")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_settings(old: dict, new: dict, path) -> None:
    """Resuming under other settings would mix runs that do not compare: name the first setting that differs."""

    old, new = _flat(old), _flat(json.loads(json.dumps(new)))     # compare as read back (tuples become lists)
    for key in dict.fromkeys([*new, *old]):
        if old.get(key) != new.get(key):
            raise CliError(f"cannot resume {path}: its runs have {key}={old.get(key)!r}, this run "
                           f"{key}={new.get(key)!r} (use the same settings, or drop --resume to start afresh)")


class RunsFile:
    """The runs file: a header line {"format", "settings"}, then a {"run": ...} line per finished run and a
    {"skip": ..., "reason": ...} line per prompt too long for the model, each flushed as it is written, so that a
    killed benchmark loses at most the run in progress."""

    def __init__(self, path: Path, settings: dict, resume: bool):
        self.path, self.runs, self.skips = Path(path), [], []
        if not (resume and self.path.is_file() and self._read(settings)):
            self._start(settings, resume)
        self.fh = open(self.path, "a", encoding="utf-8")

    def _start(self, settings: dict, resume: bool) -> None:
        if self.path.exists() and not resume:
            print(f"[bench] replacing {self.path} (--resume would have continued it)", file=sys.stderr)
        elif resume:
            print(f"[bench] nothing to resume in {self.path}: starting", file=sys.stderr)
        _write_atomic(self.path, [json.dumps({"format": RUNS_FORMAT, "settings": settings})])

    def _read(self, settings: dict) -> bool:
        """Load the records of an earlier session; False when the file holds none (start afresh)."""

        text = self.path.read_text(encoding="utf-8", errors="replace")
        good, bad = [], 0
        for line in filter(str.strip, text.split("\n")):
            try:
                good.append((line, json.loads(line)))
            except json.JSONDecodeError:
                bad += 1              # the last line of a killed run, cut short
        if not good:
            return False
        header = good[0][1]
        if not isinstance(header, dict) or header.get("format") != RUNS_FORMAT:
            raise CliError(f"cannot resume {self.path}: not a bench runs file ({RUNS_FORMAT})")
        check_settings(header.get("settings", {}), settings, self.path)
        for _, rec in good[1:]:
            if "run" in rec:
                self.runs.append(rec["run"])
            elif "skip" in rec:
                self.skips.append(rec)
        if bad or not text.endswith("\n"):
            # drop the cut line, so that the next record starts on a line of its own
            print(f"[bench] {self.path}: ignored {bad} unreadable line(s); that run is redone", file=sys.stderr)
            _write_atomic(self.path, [line for line, _ in good])
        return True

    def add_run(self, run: Run) -> None:
        self._append({"run": run_to_dict(run)})

    def add_skip(self, prompt: BenchPrompt, reason: str) -> None:
        self._append({"skip": prompt_ident(prompt), "reason": reason})

    def _append(self, record: dict) -> None:
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def _write_atomic(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def restore(runs_file: RunsFile, prompts: list[BenchPrompt], workload_info: dict):
    """This session's prompts less those the runs file skipped, and its runs of them keyed by run_key (runs of
    other prompts are ignored)."""
    by_ident = {ident_tuple(prompt_ident(p)): p for p in prompts}
    skipped = set()
    for rec in runs_file.skips:
        ident = ident_tuple(rec["skip"])
        if ident in by_ident and ident not in skipped:
            skipped.add(ident)
            _skip(workload_info, by_ident[ident], rec["reason"])
    done: dict[tuple, Run] = {}
    for d in runs_file.runs:
        p = by_ident.get(ident_tuple(d["prompt"]))
        if p is None:
            continue
        if not p.ids:
            p.ids = list(d["prompt"]["ids"])      # a dtype that is all done is not loaded to tokenize
        run = run_from_dict(d, p)
        done[key_of(run)] = run
    kept = [p for p in prompts if ident_tuple(prompt_ident(p)) not in skipped]
    return kept, done


def planned_keys(dtype: str, prompts: list[BenchPrompt], temps, methods, seed: int) -> list[tuple]:
    return [run_key(prompt_ident(p), dtype, t, m, seed + i) for i, p in enumerate(prompts) for t in temps
            for m in methods]


def complete_runs(done: dict, dtypes, prompts, temps, methods, seed: int) -> list[Run]:
    """The runs of each prompt that every method finished, in run order, greedy ones compared with the plain
    reference among them. Old and new runs alike, so identity counts do not depend on where a session stopped."""
    runs = []
    for dtype in dtypes:
        for i, p in enumerate(prompts):
            ident = prompt_ident(p)
            for t in temps:
                group = {m: done.get(run_key(ident, dtype, t, m, seed + i)) for m in methods}
                if None in group.values():
                    continue          # cut short mid-prompt: its finished runs wait in the runs file
                if is_greedy(t):
                    compare_to_reference(group)
                runs.extend(group.values())
    return runs


def compare_to_reference(group: dict[str, Run]) -> None:
    ref = next((r for r in PLAIN if r in group), None)
    if ref is None:
        return
    for run in group.values():
        run.reference, run.first_diff = ref, first_difference(run.output, group[ref].output)


# ---------------------------------------------------------------------------------------------------- runners
class Runner:
    """Decodes one prompt with one method on a loaded target, timing the whole call."""

    def __init__(self, target, proposers: dict, stops, args):

        self.target, self.proposers, self.stops, self.args = target, proposers, frozenset(stops), args
        self.cuda = target.device.type == "cuda"
        tok = target.tokenizer
        pad = getattr(tok, "pad_token_id", None) if tok is not None else None
        self.pad_id = pad if pad is not None else min(self.stops) if self.stops else 0

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def run(self, method: str, prompt: BenchPrompt, temperature: float, seed: int, max_new: int) -> Run:
        if method in HF_METHODS:
            return self._run_hf(method, prompt, temperature, seed, max_new)
        return self._run_ours(method, prompt, temperature, seed, max_new)

    def _run_ours(self, method, prompt, temperature, seed, max_new) -> Run:

        a = self.args
        cfg = GenerationConfig(max_new, SamplingConfig(temperature, a.top_p, a.top_k, seed), stop_ids=self.stops)
        metrics = Metrics()
        out: list[int] = []
        stop = None
        self._sync()
        t0 = time.perf_counter()
        for step in generate(self.target, self.proposers[method], prompt.ids, cfg):
            metrics.observe(step)
            out.extend(step.new_tokens)
            stop = step.stop_reason
        self._sync()
        seconds = time.perf_counter() - t0
        return Run(prompt, method, "", temperature, cut_at_stop(out, self.stops, max_new), seconds,
                   metrics=metrics, stop=stop)

    def _run_hf(self, method, prompt, temperature, seed, max_new) -> Run:
        a = self.args
        model = self.target.model
        device = self.target.device
        ids = torch.tensor([prompt.ids], dtype=torch.long, device=device)
        kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                      eos_token_id=sorted(self.stops), pad_token_id=self.pad_id)
        if is_greedy(temperature):
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=temperature, top_p=a.top_p, top_k=a.top_k)
            torch.manual_seed(seed)
        if method == "hf_pld":
            kwargs.update(prompt_lookup_num_tokens=a.pld_tokens, max_matching_ngram_size=a.pld_ngram)
        calls = [0]

        def count(module, inputs, output):
            calls[0] += 1

        handle = model.register_forward_hook(count)
        try:
            self._sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(**kwargs)
            self._sync()
            seconds = time.perf_counter() - t0
        finally:
            handle.remove()
        new = [int(t) for t in out[0, ids.shape[1]:].tolist()]
        cut = cut_at_stop(new, self.stops, max_new)
        stop = "stop_token" if cut and cut[-1] in self.stops else "max_new_tokens"
        return Run(prompt, method, "", temperature, cut, seconds, forwards=calls[0], stop=stop)


# ---------------------------------------------------------------------------------------------------- the run
def run_bench(args) -> dict:
    """Run the benchmark described by parsed CLI `args`; print the table, write the JSON, return the report."""


    methods = parse_methods(args.methods)
    dtypes = parse_dtypes(args.dtype)
    temps = parse_temperatures(args.temperature)
    if args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.limit is not None and args.limit < 1:
        raise CliError(f"--limit must be >= 1, got {args.limit}")
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be >= 1, got {args.threads}")
    if args.warmup < 0:
        raise CliError(f"--warmup must be >= 0, got {args.warmup}")
    if not 0 < args.top_p <= 1 or args.top_k < 0:
        raise CliError("--top-p must be in (0, 1] and --top-k >= 0")
    if args.resume and not args.out:
        raise CliError("--resume needs --out: the report whose runs file to continue")
    search_cfg = search_config_from(args)
    out_path = check_writable(args.out or default_out_path())
    workloads = _split(args.workloads) if args.workloads is not None else ([] if args.prompts else
                                                                           ["mtbench", "humaneval"])
    prompts, workload_info = load_prompts(workloads, args.prompts, args.limit)
    if not prompts:
        raise CliError("no prompts to run (check --workloads / --prompts)")
    ngram = args.ngram
    if {"dart", "dart_pld"} & set(methods) and ngram == "default":
        ngram = str(ensure_default_ngram(progress=not args.no_progress))
    progress = not args.no_progress

    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, methods, dtypes, temps, search_cfg, out_path, prompts, workload_info, ngram, progress)
    finally:
        torch.set_num_threads(threads)


def _run(args, methods, dtypes, temps, search_cfg, out_path, prompts, workload_info, ngram, progress) -> dict:


    started = time.time()
    runs_file = RunsFile(runs_path(out_path), resume_settings(args, ngram, search_cfg), args.resume)
    prompts, done = restore(runs_file, prompts, workload_info)
    restored = set(done)
    total = len(dtypes) * len(prompts) * len(temps) * len(methods)
    already = sum(k in restored for d in dtypes for k in planned_keys(d, prompts, temps, methods, args.seed))
    bar = tqdm(total=total, initial=already, unit="run", desc="bench", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    env = {}
    try:
        for dtype in dtypes:
            if all(k in done for k in planned_keys(dtype, prompts, temps, methods, args.seed)):
                continue          # every run of this dtype is in the runs file: do not even load it
            bar.set_description(f"bench {dtype}: loading")
            target = load_target(args.model, args.device, dtype)
            stops = stop_ids(target)
            proposers = {m: make_proposer(m, target, args.draft, ngram, search_cfg, args.pld_tokens, args.pld_ngram,
                                           args.ngram_context_weight, args.lookup_tokens)
                         for m in methods if m not in HF_METHODS}
            keep = []
            for p in prompts:
                if not p.ids:
                    p.ids = encode_prompt(target.tokenizer, p.text, raw=p.raw)
                if len(p.ids) + args.max_new_tokens > target.max_positions:
                    reason = (f"{p.id}: prompt of {len(p.ids)} tokens + max new tokens exceeds the context of "
                              f"{target.max_positions}")
                    _skip(workload_info, p, reason)
                    runs_file.add_skip(p, reason)    # so that a resumed run skips it without loading the model
                    continue
                keep.append(p)
            prompts = keep
            env.setdefault("target", {"vocab_size": target.vocab_size, "layers": target.num_layers,
                                      "hidden_size": target.hidden_size, "stop_ids": sorted(stops)})
            runner = Runner(target, proposers, stops, args)
            bar.set_description(f"bench {dtype}: warm-up")
            for p in prompts[: args.warmup]:
                for m in methods:
                    runner.run(m, p, 0.0, args.seed, min(WARMUP_TOKENS, args.max_new_tokens))
            bar.set_description(f"bench {dtype}")
            for i, p in enumerate(prompts):
                ident = prompt_ident(p)
                seed = args.seed + i
                order = methods[i % len(methods):] + methods[: i % len(methods)]  # rotate: cancel drift
                for temperature in temps:
                    for m in order:
                        key = run_key(ident, dtype, temperature, m, seed)
                        if key in done:
                            continue
                        bar.set_postfix_str(f"{m} {p.id}", refresh=False)
                        run = runner.run(m, p, temperature, seed, args.max_new_tokens)
                        run.dtype, run.seed = dtype, seed
                        runs_file.add_run(run)
                        done[key] = run
                        bar.update(1)
            del runner, proposers, target
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    except KeyboardInterrupt:
        interrupted = True       # report what is complete (whole prompts only), then stop
    else:
        interrupted = False
    finally:
        bar.close()
        runs_file.close()

    runs = complete_runs(done, dtypes, prompts, temps, methods, args.seed)
    report = build_report(runs, methods, dtypes, temps, workload_info)
    report["interrupted"] = interrupted
    report["runs_file"] = str(runs_file.path)
    report["resumed_runs"] = sum(key_of(r) in restored for r in runs)     # taken from an earlier session
    report["settings"] = {
        "model": args.model, "draft": args.draft, "ngram": ngram, "device": args.device, "dtypes": dtypes,
        "methods": methods, "temperatures": temps, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed,
        "max_new_tokens": args.max_new_tokens, "limit": args.limit, "warmup": args.warmup,
        "pld_tokens": args.pld_tokens, "pld_ngram": args.pld_ngram, "search": search_cfg.to_dict(),
        "workloads": list(workload_info), "prompts_file": args.prompts,
    }
    report["environment"] = {
        **env, "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "wall_seconds": round(time.time() - started, 1),     # this session's
    }
    text = format_table(report)
    print(text)
    Path(out_path).write_text(json.dumps(report, indent=1))
    print(f"wrote {out_path}" + (f" (partial: interrupted; --resume continues from {runs_file.path})"
                                 if interrupted else ""), file=sys.stderr)
    if interrupted:
        raise KeyboardInterrupt
    report["out"] = str(out_path)
    return report


def _skip(info: dict, prompt: BenchPrompt, reason: str) -> None:
    w = info[prompt.workload]
    w["prompts"] -= 1
    w["skipped"] = w.get("skipped", 0) + 1
    w.setdefault("skipped_reasons", []).append(reason)
    print(f"[bench] skipped {reason}", file=sys.stderr)


def default_out_path() -> str:
    return str(Path("runs") / f"bench-{datetime.now():%Y%m%d-%H%M%S}.json")


def build_report(runs: list[Run], methods, dtypes, temps, workload_info) -> dict:
    cells: dict[tuple, Cell] = {}
    groups: dict[tuple, dict[str, Run]] = {}
    for run in runs:
        groups.setdefault((id(run.prompt), run.dtype, run.temperature), {})[run.method] = run
    for run in runs:
        cmp_all = {}
        if run.reference is not None:
            siblings = groups[(id(run.prompt), run.dtype, run.temperature)]
            cmp_all = {ref: first_difference(run.output, siblings[ref].output)
                       for ref in PLAIN if ref in siblings and ref != run.method}
        for w in (run.prompt.workload, ALL):
            key = (run.method, run.dtype, run.temperature, w)
            if key not in cells:
                cells[key] = Cell(run.method, run.dtype, run.temperature, w)
            cells[key].add(run, cmp_all)

    results = []
    workloads = [ALL] + [w for w in workload_info if any(r.prompt.workload == w for r in runs)]
    for t in temps:
        for w in workloads:
            hf = {d: cells.get(("hf_generate", d, t, w)) for d in dtypes}
            hf_speed = {d: c.tokens_per_s for d, c in hf.items() if c is not None and c.tokens_per_s > 0}
            best = max(hf_speed.values()) if hf_speed else None
            for m in methods:
                for d in dtypes:
                    c = cells.get((m, d, t, w))
                    if c is None:
                        continue
                    r = c.to_dict()
                    if d in hf_speed:
                        r["speedup"] = round(c.tokens_per_s / hf_speed[d], 4)
                    if "fp32" in hf_speed:
                        r["speedup_vs_hf_fp32"] = round(c.tokens_per_s / hf_speed["fp32"], 4)
                    if best:
                        r["speedup_vs_hf_best"] = round(c.tokens_per_s / best, 4)
                    results.append(r)
    per_run = [{"prompt": r.prompt.id, "workload": r.prompt.workload, "method": r.method, "dtype": r.dtype,
                "temperature": r.temperature, "prompt_tokens": len(r.prompt.ids), "new_tokens": len(r.output),
                "seconds": round(r.seconds, 5), "forwards": r.forwards if r.method in HF_METHODS else
                (r.metrics.verify_steps + 1 if r.metrics is not None else None),
                "tau": (round(len(r.output) / r.forwards, 4) if r.forwards else None) if r.method in HF_METHODS
                else round(r.metrics.tau, 4),
                "stop": r.stop, "first_diff": r.first_diff, "reference": r.reference} for r in runs]
    return {"format": BENCH_FORMAT, "workloads": workload_info, "results": results, "runs": per_run}


def format_table(report: dict) -> str:
    rows = [("workload", "temp", "method", "dtype", "n", "tok/s", "speedup", "vs hf32", "tau", "acc@1/2/3",
             "draft/search/verify %", "identical")]
    for r in report["results"]:
        acc = r["acceptance_by_depth"]
        acc_s = "/".join(f"{x:.2f}" for x in (acc or [])[:3]) if acc else "-"
        sh = r["phase_share"]
        sh_s = "/".join(f"{100 * sh[p]:.0f}" for p in ("draft", "search", "verify")) if sh else "-"
        if r["identical"] is None:
            ident = "-"
        elif r["reference"] == r["method"]:
            ident = "ref"
        else:
            ident = f"{r['identical']}/{r['compared']}"
        rows.append((r["workload"], f"{r['temperature']:g}", r["method"], r["dtype"], str(r["prompts"]),
                     f"{r['tokens_per_s']:.1f}", _x(r["speedup"]), _x(r["speedup_vs_hf_fp32"]),
                     "-" if r["tau"] is None else f"{r['tau']:.2f}", acc_s, sh_s, ident))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


# ---------------------------------------------------------------------------------------------------- CLI
def cmd_bench(args) -> int:
    run_bench(args)
    return 0


def add_bench_args(p) -> None:

    add_model_args(p)
    # --dtype takes a comma list here (the parser resolves the conflict with add_model_args' single choice).
    p.add_argument("--dtype", default="fp32,bf16", help="comma list of fp32, bf16, fp16 (the target loads once each)")
    p.add_argument("--ngram", default="default",
                   help="'default' (the shipped assets/ table, else one built once into the user cache: ~1 min), "
                        "'none', or an n-gram .npz file")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    p.add_argument("--workloads", default=None,
                   help="comma list of mtbench, humaneval (default: both, or none when --prompts is given)")
    p.add_argument("--prompts", default=None, help="a jsonl file with a 'prompt' field a line (bad lines skipped)")
    p.add_argument("--limit", type=int, default=None, help="prompts per workload at most")
    p.add_argument("--max-new-tokens", type=int, default=128, help="per prompt and method")
    p.add_argument("--temperature", default="0,0.7", help="comma list; 0 = greedy (default: 0,0.7)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the first prompt (then +1 a prompt)")
    p.add_argument("--pld-tokens", type=int, default=10, help="prompt lookup: draft tokens (pld, hf_pld, dart_pld)")
    p.add_argument("--pld-ngram", type=int, default=3, help="prompt lookup: longest n-gram matched")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--warmup", type=int, default=1, help="prompts decoded untimed per dtype before the run")
    p.add_argument("--out", default=None, help="the JSON report (default runs/bench-DATE-TIME.json)")
    p.add_argument("--resume", action="store_true",
                   help="continue the runs recorded in the runs file next to --out (OUT.runs.jsonl, written as "
                        "runs finish): skip those, run the rest, report all; the settings must be the same")
    p.add_argument("--no-progress", action="store_true")
    add_search_args(p)


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark dart / pld / plain decoding against transformers generate",
                       description="Decode each prompt with every method (alternating per prompt), print a table "
                                   "and write a JSON report: tokens/s, speedup over transformers generate, tau, "
                                   "acceptance by depth, draft/search/verify time shares, and for greedy runs "
                                   "how many outputs are token-identical to plain decoding. Each finished "
                                   "run is also appended to OUT.runs.jsonl, so --resume can continue a "
                                   "benchmark that was stopped.",
                       conflict_handler="resolve")
    add_bench_args(p)
    p.set_defaults(handler=cmd_bench)
