"""Per-step records of a decoding run, and their JSON form (a saved trace replays with no model)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .tree import TokenTree
from .tree_search import Candidates

TRACE_FORMAT = "dart-lab-trace/1"
PHASES = ("draft", "search", "verify", "accept")


class TraceError(ValueError):
    pass


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
    candidates: Candidates | None = None
    lookup_nodes: list[int] = field(default_factory=list)  # tree nodes from a prompt-lookup branch (dart_pld)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase (see PHASES, plus "prefill")
    elapsed: float = 0.0             # seconds since the generation started, at the end of this step
    stop_reason: str | None = None   # set on the last step: "stop_token", "max_new_tokens", "context_full"

    def to_dict(self) -> dict:
        return {
            "index": self.index, "kind": self.kind, "context_len": self.context_len,
            "new_tokens": list(self.new_tokens), "accepted": self.accepted,
            "tree": self.tree.to_dict() if self.tree else None, "path": list(self.path),
            "rows_tokens": None if self.rows_tokens is None else self.rows_tokens.tolist(),
            "rows_probs": None if self.rows_probs is None else np.round(self.rows_probs, 6).tolist(),
            "candidates": self.candidates.to_dict() if self.candidates is not None else None,
            "lookup_nodes": list(self.lookup_nodes),
            "timings": {k: round(v, 6) for k, v in self.timings.items()}, "elapsed": round(self.elapsed, 6),
            "stop_reason": self.stop_reason,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "StepRecord":
        return cls(
            index=int(d["index"]), kind=str(d["kind"]), context_len=int(d["context_len"]),
            new_tokens=[int(t) for t in d["new_tokens"]], accepted=int(d.get("accepted", 0)),
            tree=TokenTree.from_dict(d["tree"]) if d.get("tree") else None, path=[int(i) for i in d.get("path", [])],
            rows_tokens=None if d.get("rows_tokens") is None else np.asarray(d["rows_tokens"], dtype=np.int64),
            rows_probs=None if d.get("rows_probs") is None else np.asarray(d["rows_probs"], dtype=np.float64),
            candidates=Candidates.from_dict(d["candidates"]) if d.get("candidates") else None,
            lookup_nodes=[int(i) for i in d.get("lookup_nodes", [])],
            timings={k: float(v) for k, v in d.get("timings", {}).items()}, elapsed=float(d.get("elapsed", 0.0)),
            stop_reason=d.get("stop_reason"))


@dataclass
class Trace:
    method: str
    prompt_ids: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    prompt_text: str = ""
    settings: dict = field(default_factory=dict)       # model, dtype, device, sampling, search knobs
    token_text: dict[int, str] = field(default_factory=dict)  # id -> text of every token the trace mentions

    @property
    def output_ids(self) -> list[int]:
        return [t for s in self.steps for t in s.new_tokens]

    def mentioned_tokens(self) -> set[int]:
        ids = set(self.prompt_ids) | set(self.output_ids)
        for s in self.steps:
            if s.tree:
                ids.update(s.tree.tokens)
            if s.rows_tokens is not None:
                ids.update(int(t) for t in s.rows_tokens.ravel())
            if s.candidates is not None:
                ids.update(int(t) for t in s.candidates.token)
        return ids

    def fill_token_text(self, tokenizer) -> None:
        """Record the text of every mentioned token so that a replay needs no tokenizer."""
        missing = sorted(self.mentioned_tokens() - set(self.token_text))
        for tid, text in zip(missing, tokenizer.batch_decode([[t] for t in missing])):
            self.token_text[tid] = text

    def to_dict(self) -> dict:
        return {"format": TRACE_FORMAT, "method": self.method, "prompt_ids": list(self.prompt_ids),
                "prompt_text": self.prompt_text, "settings": self.settings,
                "token_text": {str(k): v for k, v in sorted(self.token_text.items())},
                "steps": [s.to_dict() for s in self.steps]}

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        if not isinstance(d, dict) or d.get("format") != TRACE_FORMAT:
            raise TraceError(f"not a DART Lab trace (expected format {TRACE_FORMAT!r})")
        try:
            return cls(method=str(d["method"]), prompt_ids=[int(t) for t in d["prompt_ids"]],
                       steps=[StepRecord.from_dict(s) for s in d["steps"]], prompt_text=d.get("prompt_text", ""),
                       settings=d.get("settings", {}),
                       token_text={int(k): v for k, v in d.get("token_text", {}).items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"trace is damaged: {type(exc).__name__}: {exc}") from None

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path) -> "Trace":
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise TraceError(f"trace file not found: {path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(f"{path} is not JSON: {exc}") from None
        return cls.from_dict(data)
