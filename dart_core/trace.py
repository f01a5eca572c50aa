"""Per-step records of a decoding run, the settings it ran with, and their file form (a saved trace replays with no
model).

The file is JSON (gzip-compressed when the name ends in .gz). Format 2 stores the numeric columns (draft rows,
tree-search candidates) as typed little-endian arrays in base64, several times smaller than lists of numbers;
`save(..., top_candidates=N)` keeps only the best N candidates of each step (and the tree's own), for small files.
Format 1 files (numbers as JSON lists, settings as a free dict) still load.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from .acceptance import SamplingConfig
from .errors import DartError
from .machine.records import MachineRecord
from .methods import DART, DART_PLD, METHODS
from .budget.step_budget import StepBudget
from .tree import TokenTree
from .tree_search import BEAM_STATES, FATES, KEPT, Candidates, SearchConfig, rescore

TRACE_FORMAT = "dart-lab-trace/2"
READABLE_FORMATS = ("dart-lab-trace/1", TRACE_FORMAT)
PHASES = ("draft", "search", "verify", "accept")
# Storage type of each candidate column in format 2 (fate and beam as indices into FATES / BEAM_STATES).
CANDIDATE_TYPES = {"token": "<i4", "level": "<i2", "parent": "<i4", "draft_prob": "<f4", "logit_term": "<f4",
                   "ngram_prob": "<f4", "ngram_match": "<i1", "ngram_term": "<f4", "level_weight": "<f4",
                   "score": "<f4", "fate": "<i1", "beam": "<i1", "node": "<i2"}
CANDIDATE_DTYPES = {"token": np.int64, "level": np.int32, "parent": np.int32, "ngram_match": np.int8,
                    "node": np.int32}
CODES = {"fate": FATES, "beam": BEAM_STATES}
DERIVED_COLUMNS = ("ngram_term", "score")   # recomputed on loading (see pack_candidates)


class TraceError(DartError):
    """A trace file that cannot be read: missing, not JSON, another format or version, or damaged."""


# ---------------------------------------------------------------------------------------------------- settings
@dataclass
class RunSettings:
    """How a run was made: the names of what was loaded, the sampling and search settings, and the stop ids.
    Written by `dart_core.setup.loading.Loaded.new_trace` for the command line and the app alike."""
    model: str | None = None
    draft: str | None = None           # DART's head ('default', 'random', a folder); None without one
    ngram: str | None = None           # the n-gram table ('default', 'none', a file); None without one
    device: str = "cpu"
    dtype: str = "fp32"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    search: SearchConfig | None = None  # the tree search knobs (DART methods only)
    max_new_tokens: int = 0
    stop_ids: list[int] = field(default_factory=list)
    lookup_tokens: int | None = None    # dart_pld: the length of the prompt-lookup branch
    ngram_context_weight: float = 0.0
    auto_budget: bool = False           # DART: the node budget chosen as the run goes (search.node_budget: the start)
    machine: MachineRecord | None = None   # where it ran: the hardware, the dtype, the cost curve, ...
    lane_seconds: float | None = None     # the app's lane time: its own steps only (lanes take turns on one CPU)
    top_candidates: int | None = None   # set when the file keeps only the best N candidates of each step

    def text(self) -> str:
        """'model default (fp32) · greedy · Intel(R) Xeon(R) Processor · AVX512 · 2 threads · ...'."""
        bits = [f"model {self.model or '?'}" + (f" ({self.dtype})" if self.dtype else ""), self.sampling.text()]
        if self.machine is not None and self.machine.summary:
            bits.append(self.machine.summary)
        return " · ".join(bits)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sampling"] = self.sampling.to_dict()
        d["search"] = None if self.search is None else self.search.to_dict()
        d["machine"] = None if self.machine is None else self.machine.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: dict | None) -> "RunSettings":
        """Lenient: unknown keys are ignored and missing ones take their defaults (format 1 wrote a free dict)."""
        data = dict(data or {})
        names = {f.name for f in fields(cls)}
        out = {k: v for k, v in data.items() if k in names}
        out["sampling"] = SamplingConfig.from_dict(data.get("sampling") or {})
        out["search"] = SearchConfig.from_dict(data["search"]) if isinstance(data.get("search"), dict) else None
        out["stop_ids"] = [int(t) for t in data.get("stop_ids") or []]
        out["machine"] = MachineRecord.from_dict(data["machine"]) if isinstance(data.get("machine"), dict) else None
        for older in ("own_time_s", "lane_time_s"):        # the names earlier versions wrote it under
            if out.get("lane_seconds") is None and isinstance(data.get(older), (int, float)):
                out["lane_seconds"] = float(data[older])
        return cls(**out)


# ---------------------------------------------------------------------------------------------------- steps
@dataclass
class StepRecord:
    index: int                       # 0 is the prefill
    kind: str                        # "prefill" or "verify"
    context_len: int                 # tokens in the target cache before this step
    new_tokens: list[int]            # tokens emitted by this step: accepted drafts, then the target's bonus token
    accepted: int = 0                # draft tokens accepted
    tree: TokenTree | None = None    # the verified tree (root = the token emitted by the previous step)
    path: list[int] = field(default_factory=list)   # accepted tree nodes, root first
    rows_tokens: np.ndarray | None = None           # [R, k] draft top-k per logit row
    rows_probs: np.ndarray | None = None
    candidates: Candidates | None = None   # given as a function (the search's `recorded`), made when first read
    lookup_nodes: list[int] = field(default_factory=list)  # tree nodes from a prompt-lookup branch (dart_pld)
    budget: StepBudget | None = None  # DART: the node budget, and how an automatic one was chosen
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase (see PHASES, plus "prefill")
    elapsed: float = 0.0             # seconds since the generation started, at the end of this step
    stop_reason: str | None = None   # set on the last step: "stop_token", "max_new_tokens", "context_full"

    @property
    def drafted(self) -> bool:
        """Whether the target verified proposed tokens this step: a tree beyond its root (a drafted tree, a lookup
        branch or both)."""
        return self.tree is not None and len(self.tree) > 1

    def lookup_branch(self, looked_up: list[int] | None = None) -> list[int]:
        """The prompt-lookup branch this step grafted (empty without one). `looked_up`: the branch looked up again
        from the step's context at its longest (it depends on the context alone), cut to the length the step
        grafted; without it, read back from the tree's lookup nodes (empty where the branch added none)."""
        if looked_up is not None:
            return self.budget.branch_used(looked_up) if self.budget is not None else looked_up
        if not self.lookup_nodes:
            return []
        return [self.tree.tokens[n] for n in self.tree.path_to(max(self.lookup_nodes))[1:]]

    def mentioned_tokens(self) -> set[int]:
        ids = set(self.new_tokens)
        if self.tree:
            ids.update(self.tree.tokens)
        if self.rows_tokens is not None:
            ids.update(int(t) for t in self.rows_tokens.ravel())
        if self.candidates is not None:
            ids.update(int(t) for t in self.candidates.token)
        return ids

    def to_dict(self, top_candidates: int | None = None, search: SearchConfig | None = None) -> dict:
        """`search`: the knobs the step's search ran with; given, the columns that follow from them are not stored."""
        cand = self.candidates
        if cand is not None and top_candidates is not None:
            cand = best_candidates(cand, top_candidates)
        return {
            "index": self.index, "kind": self.kind, "context_len": self.context_len,
            "new_tokens": list(self.new_tokens), "accepted": self.accepted,
            "tree": self.tree.to_dict() if self.tree else None, "path": list(self.path),
            "rows_tokens": None if self.rows_tokens is None else pack(self.rows_tokens, "<i4"),
            "rows_probs": None if self.rows_probs is None else pack(self.rows_probs, "<f4"),
            "candidates": None if cand is None else pack_candidates(cand, search),
            "lookup_nodes": list(self.lookup_nodes),
            "budget": None if self.budget is None else self.budget.to_dict(),
            "timings": {k: round(v, 6) for k, v in self.timings.items()}, "elapsed": round(self.elapsed, 6),
            "stop_reason": self.stop_reason,
        }

    @classmethod
    def from_dict(cls, d: dict, version: int = 2) -> "StepRecord":
        arrays = unpack if version >= 2 else np.asarray
        cand = d.get("candidates")
        if cand:
            cand = unpack_candidates(cand) if version >= 2 else Candidates.from_dict(cand)
        return cls(
            index=int(d["index"]), kind=str(d["kind"]), context_len=int(d["context_len"]),
            new_tokens=[int(t) for t in d["new_tokens"]], accepted=int(d.get("accepted", 0)),
            tree=TokenTree.from_dict(d["tree"]) if d.get("tree") else None, path=[int(i) for i in d.get("path", [])],
            rows_tokens=None if d.get("rows_tokens") is None else arrays(d["rows_tokens"]).astype(np.int64),
            rows_probs=None if d.get("rows_probs") is None else arrays(d["rows_probs"]).astype(np.float64),
            candidates=cand or None, lookup_nodes=[int(i) for i in d.get("lookup_nodes", [])],
            budget=StepBudget.from_dict(d["budget"]) if d.get("budget") else None,
            timings={k: float(v) for k, v in d.get("timings", {}).items()}, elapsed=float(d.get("elapsed", 0.0)),
            stop_reason=d.get("stop_reason"))


def _candidates(step: StepRecord) -> Candidates | None:
    made = step.__dict__.get("_candidates")
    if callable(made):   # the record of every candidate costs a decode step about 0.15 ms: made when someone reads it
        made = step.__dict__["_candidates"] = made()
    return made


StepRecord.candidates = property(_candidates, lambda step, value: step.__dict__.__setitem__("_candidates", value))


# ---------------------------------------------------------------------------------------------------- traces
@dataclass
class Trace:
    method: str                      # one of dart_core.methods.METHODS
    prompt_ids: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    prompt_text: str = ""
    settings: RunSettings = field(default_factory=RunSettings)
    token_text: dict[int, str] = field(default_factory=dict)  # id -> text of every token the trace mentions

    def __post_init__(self):
        if self.method not in METHODS:
            raise TraceError(f"unknown method {self.method!r} (expected one of {', '.join(METHODS)})")

    @property
    def output_ids(self) -> list[int]:
        return [t for s in self.steps for t in s.new_tokens]

    def context_at(self, index: int) -> list[int]:
        """Committed tokens before step `index`, ending with its root (the previous step's last token)."""
        ctx = list(self.prompt_ids)
        for s in self.steps[:index]:
            ctx.extend(s.new_tokens)
        return ctx

    @property
    def uses_tree_search(self) -> bool:
        return self.method in (DART, DART_PLD)

    def mentioned_tokens(self) -> set[int]:
        ids = set(self.prompt_ids)
        for s in self.steps:
            ids |= s.mentioned_tokens()
        return ids

    def name_tokens(self, tokenizer, ids=None) -> None:
        """Record the text of `ids` (default: every token the trace mentions) so that a replay needs no tokenizer."""
        wanted = self.mentioned_tokens() if ids is None else {int(t) for t in ids}
        missing = sorted(wanted - set(self.token_text))
        if tokenizer is not None and missing:
            for tid, text in zip(missing, tokenizer.batch_decode([[t] for t in missing])):
                self.token_text[tid] = text

    def to_dict(self, top_candidates: int | None = None) -> dict:
        settings = self.settings.to_dict()
        if top_candidates is not None:
            settings["top_candidates"] = top_candidates
        return {"format": TRACE_FORMAT, "method": self.method, "prompt_ids": list(self.prompt_ids),
                "prompt_text": self.prompt_text, "settings": settings,
                "token_text": {str(k): v for k, v in sorted(self.token_text.items())},
                "steps": [s.to_dict(top_candidates, self.settings.search) for s in self.steps]}

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        fmt = d.get("format") if isinstance(d, dict) else None
        if not isinstance(fmt, str) or not fmt.startswith("dart-lab-trace/"):
            raise TraceError(f"not a DART Lab trace (expected format {TRACE_FORMAT!r})")
        if fmt not in READABLE_FORMATS:
            raise TraceError(f"trace format {fmt!r} is not supported: this version reads "
                             f"{' and '.join(READABLE_FORMATS)}")
        version = int(fmt.rsplit("/", 1)[1])
        try:
            settings = d.get("settings") or {}
            method = str(d["method"])
            if version == 1 and method == DART and settings.get("lookup_branch"):
                method = DART_PLD   # format 1's app wrote dart_pld as dart plus a setting
            return cls(method=method, prompt_ids=[int(t) for t in d["prompt_ids"]],
                       steps=[StepRecord.from_dict(s, version) for s in d["steps"]],
                       prompt_text=d.get("prompt_text", ""), settings=RunSettings.from_dict(settings),
                       token_text={int(k): v for k, v in d.get("token_text", {}).items()})
        except TraceError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise TraceError(f"trace is damaged: {type(exc).__name__}: {exc}") from None

    def save(self, path, top_candidates: int | None = None) -> int:
        """Write the trace (gzip when the name ends in .gz); returns the file size in bytes."""
        data = json.dumps(self.to_dict(top_candidates), separators=(",", ":")).encode("utf-8")
        if str(path).endswith(".gz"):
            data = gzip.compress(data, compresslevel=6, mtime=0)
        Path(path).write_bytes(data)
        return len(data)

    @classmethod
    def load(cls, path) -> "Trace":
        try:
            raw = Path(path).read_bytes()
            if raw[:2] == b"\x1f\x8b":   # gzip, whatever the name
                raw = gzip.decompress(raw)
            data = json.loads(raw.decode("utf-8"))
        except FileNotFoundError:
            raise TraceError(f"trace file not found: {path}") from None
        except IsADirectoryError:
            raise TraceError(f"{path} is a folder, not a trace file") from None
        except (OSError, EOFError) as exc:  # gzip's BadGzipFile is an OSError
            raise TraceError(f"{path} cannot be read: {exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(f"{path} is not JSON: {exc}") from None
        return cls.from_dict(data)


def check_trace(trace: Trace) -> None:
    """Reject a trace with no steps, or whose steps do not hang together (they would break the views)."""
    if not trace.steps:
        raise TraceError("the trace has no steps")
    for i, s in enumerate(trace.steps):
        if s.index != i:
            raise TraceError(f"step {i} is numbered {s.index}")
        if s.kind not in ("prefill", "verify"):
            raise TraceError(f"step {i} has unknown kind {s.kind!r}")
        if s.tree is not None:
            if any(not 0 <= n < len(s.tree) for n in s.path) or (s.path and s.path[0] != 0):
                raise TraceError(f"step {i}: the accepted path is not inside its tree")
            if s.candidates is not None:
                c = s.candidates
                cols = {len(getattr(c, f)) for f in ("token", "level", "parent", "score", "fate", "beam", "node")}
                if len(cols) != 1:
                    raise TraceError(f"step {i}: candidate columns differ in length")
                if len(c) and (c.parent.max() >= len(c) or c.node.max() >= len(s.tree)):
                    raise TraceError(f"step {i}: candidates point outside the step")
        if s.rows_tokens is not None and (s.rows_probs is None or s.rows_tokens.shape != s.rows_probs.shape
                                          or s.rows_tokens.ndim != 2):
            raise TraceError(f"step {i}: draft rows are malformed")


# ---------------------------------------------------------------------------------------------------- encoding
def pack(array: np.ndarray, dtype: str) -> dict:
    """A numeric array as {"dtype", "shape", "b64"}: little-endian bytes in base64."""
    a = np.ascontiguousarray(np.asarray(array).astype(dtype))
    return {"dtype": dtype, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def unpack(d: dict) -> np.ndarray:
    raw = base64.b64decode(d["b64"], validate=True)
    return np.frombuffer(raw, dtype=np.dtype(d["dtype"])).reshape(d["shape"])


def pack_candidates(c: Candidates, search: SearchConfig | None = None) -> dict:
    """The candidate columns as packed arrays. With the search's knobs, the two columns that follow from the others
    (the n-gram term and the cumulative score: half the bytes of a trace) are left out and recomputed on loading."""
    out = {}
    derived = DERIVED_COLUMNS if search is not None else ()
    for name, dtype in CANDIDATE_TYPES.items():
        if name in derived:
            continue
        col = getattr(c, name)
        if name in CODES:
            col = np.asarray([CODES[name].index(v) for v in col.tolist()], dtype=np.int8)
        out[name] = pack(col, dtype)
    if derived:
        out["derived"] = {"columns": list(derived), "ngram_weight": search.ngram_weight, "eps": search.eps}
    return out


def unpack_candidates(d: dict) -> Candidates:
    cols = {}
    derived = d.get("derived") or {}
    for name in CANDIDATE_TYPES:
        if name in derived.get("columns", ()):
            continue
        col = unpack(d[name])
        if name in CODES:
            cols[name] = np.asarray(CODES[name], dtype=object)[col.astype(np.int64)]
        else:
            cols[name] = col.astype(CANDIDATE_DTYPES.get(name, np.float64))
    if derived:
        cols["ngram_term"], cols["score"] = rescore(cols, float(derived["ngram_weight"]), float(derived["eps"]))
    return Candidates(**cols)


def best_candidates(c: Candidates, n: int) -> Candidates:
    """The best `n` candidates by score, every kept one, and the ancestors of all of them (so each keeps its parent
    path), with parents renumbered."""
    keep = np.zeros(len(c), dtype=bool)
    keep[np.argsort(-c.score, kind="stable")[:max(n, 0)]] = True
    keep |= c.fate == KEPT
    for i in np.flatnonzero(keep)[::-1]:     # parents come before children: walk up from the deepest
        p = int(c.parent[i])
        while p >= 0 and not keep[p]:
            keep[p] = True
            p = int(c.parent[p])
    idx = np.flatnonzero(keep)
    new_index = np.full(len(c), -1, dtype=np.int64)
    new_index[idx] = np.arange(len(idx))
    cols = {f.name: getattr(c, f.name)[idx] for f in fields(Candidates)}
    cols["parent"] = np.where(cols["parent"] >= 0, new_index[np.maximum(cols["parent"], 0)], -1).astype(np.int32)
    return Candidates(**cols)
