"""The one object the app shares between sessions: the loaded model, draft head and n-gram table (or none of
them, in replay mode), with a lock so that only one step drives the model at a time.

Everything per user lives in `app.session.Session` (in a `gr.State`), never here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from dart_core.acceptance import SamplingConfig
from dart_core.decoding import GenerationConfig, generate, verify_once
from dart_core.draft_head import DraftHead, DraftHeadError
from dart_core.loading import (DEFAULT_HEAD, build_proposer, check_ngram_fits, encode_prompt, load_draft,
                               load_ngram, load_target, stop_ids)
from dart_core.ngram import NGramModel
from dart_core.proposers import Proposer
from dart_core.target import TargetModel
from dart_core.trace import StepRecord, Trace
from dart_core.tree import TokenTree
from dart_core.tree_search import SearchConfig

from .options import MAX_PROMPT_TOKENS


class EngineError(RuntimeError):
    """The engine cannot do what was asked (e.g. generate in replay mode); the message says why."""


@dataclass
class Engine:
    target: TargetModel | None = None
    head: DraftHead | None = None
    ngram: NGramModel | None = None
    stop_ids: frozenset[int] = frozenset()
    settings: dict = field(default_factory=dict)   # model, draft, ngram, device, dtype as loaded
    notices: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, model: str = "default", draft: str = "default", ngram: str = "default", device: str = "cpu",
             dtype: str = "fp32") -> "Engine":
        """Load the target, the draft head and the n-gram table. A missing default head falls back to a random
        (untrained) head, and a missing default n-gram table to none, each with a notice for the UI."""
        target = load_target(model, device, dtype)
        notices = []
        try:
            head = load_draft(draft, target)
        except DraftHeadError:
            if draft not in (None, "", "default"):
                raise
            notices.append(f"No trained DART head is shipped yet (assets/{DEFAULT_HEAD.name}/ is missing): the app "
                           f"uses a random, untrained head. The trees are real but almost nothing gets accepted, "
                           f"so DART is slower than plain decoding here.")
            draft, head = "random", load_draft("random", target)
        else:
            if draft == "random":
                notices.append("The draft head is random (untrained, --draft random): the trees are real but almost "
                               "nothing gets accepted.")
        table = load_ngram(ngram)
        check_ngram_fits(table, target)
        settings = {"model": model, "draft": draft, "ngram": ngram, "device": device, "dtype": dtype}
        return cls(target, head, table, stop_ids(target), settings, notices)

    @classmethod
    def replay_only(cls, ngram: str | None = "default") -> "Engine":
        """No model: saved traces can be explored (and their search rerun), nothing can be generated."""
        table = load_ngram(ngram) if ngram else None
        return cls(None, None, table, frozenset(), {"model": None, "ngram": ngram if table else "none"},
                   ["Replay mode: no model is loaded. Upload a saved trace to explore it."])

    @property
    def can_generate(self) -> bool:
        return self.target is not None and self.target.tokenizer is not None

    @property
    def tokenizer(self):
        return self.target.tokenizer if self.target is not None else None

    # ------------------------------------------------------------------ generation
    def encode(self, text: str) -> list[int]:
        if not self.can_generate:
            raise EngineError("no model is loaded (replay mode): upload a trace instead")
        ids = encode_prompt(self.target, text)
        limit = min(MAX_PROMPT_TOKENS, self.target.max_positions - 16)
        if len(ids) > limit:
            raise EngineError(f"The prompt is too long: {len(ids)} tokens, at most {limit}.")
        return ids

    def proposer(self, method: str, search: SearchConfig, lookup_branch: bool = False) -> Proposer:
        """lookup_branch: DART's tree also gets prompt lookup's copied continuation (the dart_pld proposer)."""
        if lookup_branch and method == "dart":
            method = "dart_pld"
        try:
            return build_proposer(method, self.target, self.head, self.ngram, search)
        except ValueError as exc:
            raise EngineError(str(exc)) from None

    def new_trace(self, method: str, prompt_ids: list[int], prompt: str, sampling: SamplingConfig,
                  search: SearchConfig, max_new_tokens: int, lookup_branch: bool = False) -> Trace:
        settings = dict(self.settings, sampling=sampling.to_dict(), search=search.to_dict(),
                        max_new_tokens=max_new_tokens, stop_ids=sorted(self.stop_ids))
        if lookup_branch and method == "dart":
            settings["lookup_branch"] = True
        trace = Trace(method=method, prompt_ids=list(prompt_ids), prompt_text=prompt, settings=settings)
        self.name_tokens(trace, prompt_ids)
        return trace

    def steps(self, method: str, prompt_ids: list[int], sampling: SamplingConfig, search: SearchConfig,
              max_new_tokens: int, lookup_branch: bool = False):
        """The step generator of one lane (lazy: nothing runs before the first `next()`)."""
        config = GenerationConfig(max_new_tokens, sampling, stop_ids=self.stop_ids)
        return generate(self.target, self.proposer(method, search, lookup_branch), prompt_ids, config)

    def name_tokens(self, trace: Trace, ids) -> None:
        """Record the text of the given token ids in the trace (replays need no tokenizer)."""
        tok = self.tokenizer
        if tok is None:
            return
        missing = sorted({int(t) for t in ids} - trace.token_text.keys())
        if missing:
            for tid, text in zip(missing, tok.batch_decode([[t] for t in missing])):
                trace.token_text[tid] = text

    def name_step(self, trace: Trace, step: StepRecord) -> None:
        ids = set(step.new_tokens)
        if step.tree is not None:
            ids.update(step.tree.tokens)
        if step.rows_tokens is not None:
            ids.update(step.rows_tokens.ravel().tolist())
        if step.candidates is not None:
            ids.update(step.candidates.token.tolist())
        self.name_tokens(trace, ids)

    # ------------------------------------------------------------------ what-if
    def verifier(self, sampling: SamplingConfig):
        """A what-if verifier (one target forward under the lock), or None without a model."""
        if self.target is None:
            return None

        def verify(context: list[int], tree: TokenTree):
            with self.lock:
                result = verify_once(self.target, context, tree, sampling)
            return result.path, result.bonus

        return verify
