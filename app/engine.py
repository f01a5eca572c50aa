"""The one object the app shares between sessions: the loaded model, draft head and n-gram table (or none of
them, in replay mode), with a lock so that only one step drives the model at a time.

Everything per user lives in `app.session.Session` (in a `gr.State`), never here.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dart_core.acceptance import SamplingConfig
from dart_core.decoding import GenerationConfig, generate, verify_once
from dart_core.errors import DartError
from dart_core.methods import DART, DART_PLD
from dart_core.machine.records import FP32_KERNELS, KERNEL_WORDS
from dart_core.ngram import NGramModel
from dart_core.setup.calibration import cost_curve
from dart_core.setup.chat import encode_prompt
from dart_core.setup.defaults import DEFAULT_HEAD
from dart_core.setup.loading import DraftSettings, Loaded, load, load_ngram
from dart_core.trace import Trace
from dart_core.tree import TokenTree

from .options import MAX_PROMPT_TOKENS


class EngineError(DartError):
    """The engine cannot do what was asked (e.g. generate in replay mode); the message says why."""


class ModelThread:
    """One long-lived thread for all the model's work. OpenMP (torch's, and our C kernels') keeps a pool of worker
    threads for each thread that calls it; with pools from several threads on a small CPU, libgomp stops spinning and
    every parallel region wakes its workers slowly: decoding from a second thread ran 1.5x slower (51 against 33
    tokens/s on the AMX Xeon, 2 cores). Gradio calls from many threads, so the model is only ever driven from here,
    and so is every other use of torch's or our kernels' threads (loading, packing a head for a proposer, measuring):
    one use from another thread, once, slows every later step."""

    NAME = "dart-model"

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.NAME)

    def call(self, fn, *args, **kwargs):
        if threading.current_thread().name.startswith(self.NAME):   # already on it (a call made by a call)
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()

    def steps(self, generator):
        """`generator` advanced on this thread, one step per `next()`; closing the result closes it there too."""
        try:
            while True:
                try:
                    step = self.call(next, generator)
                except StopIteration:
                    return
                yield step
        finally:
            self.call(generator.close)


MODEL_THREAD = ModelThread()


@dataclass
class Engine:
    loaded: Loaded | None = None                   # None in replay mode
    replay_ngram: NGramModel | None = None         # replay mode's table, for what-if
    notices: list[str] = field(default_factory=list)
    thinking: bool = False                         # the chat template's reasoning block (Qwen3), off by default
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, model: str = "default", draft: str = "default", ngram: str = "default", device: str = "cpu",
             dtype: str = "auto", draft_kernels: str = "auto") -> "Engine":
        """Load the target, the draft head and the n-gram table. A missing default head falls back to a random
        (untrained) head, with a notice for the UI."""
        loaded = MODEL_THREAD.call(load, model, draft, ngram, device, dtype, draft_kernels=draft_kernels,
                                   random_fallback=True)
        # The verify cost curve the automatic budget chooses on, measured (once per machine, then cached) before any
        # visitor keeps the machine busy; runs never measure it again (see `steps`).
        MODEL_THREAD.call(cost_curve, loaded.target, loaded.model)
        notices = []
        if loaded.fell_back:
            notices.append(f"No trained DART head is shipped yet (assets/{DEFAULT_HEAD.name}/ is missing): the app "
                           f"uses a random, untrained head. The trees are real but almost nothing gets accepted, "
                           f"so DART is slower than plain decoding here.")
        elif draft == "random":
            notices.append("The draft head is random (untrained, --draft random): the trees are real but almost "
                           "nothing gets accepted.")
        return cls(loaded, notices=notices)

    @classmethod
    def replay_only(cls, ngram: str | None = "default") -> "Engine":
        """No model: saved traces can be explored (and their search rerun), nothing can be generated."""
        table = load_ngram(ngram) if ngram else None
        return cls(None, table, ["Replay mode: no model is loaded. Upload a saved trace to explore it."])

    @property
    def target(self):
        return self.loaded.target if self.loaded is not None else None

    @property
    def ngram(self) -> NGramModel | None:
        return self.loaded.table if self.loaded is not None else self.replay_ngram

    @property
    def can_generate(self) -> bool:
        return self.target is not None and self.target.tokenizer is not None

    @property
    def tokenizer(self):
        return self.target.tokenizer if self.target is not None else None

    def describe(self) -> str:
        """What is loaded, for the page header."""
        s = self.loaded
        choice = self.target.dtype_choice
        dtype = choice.text() if choice is not None else s.dtype
        kernels = s.draft_choice.kernels if s.draft_choice is not None else FP32_KERNELS
        head = s.draft if kernels == FP32_KERNELS else f"{s.draft}, drafting {KERNEL_WORDS[kernels]}"
        return (f"Model: {s.model} · draft head: {head} · n-gram: {s.ngram} · {dtype} · "
                f"{self.target.hardware.describe()}")

    # ------------------------------------------------------------------ generation
    def encode(self, text: str) -> list[int]:
        if not self.can_generate:
            raise EngineError("no model is loaded (replay mode): upload a trace instead")
        ids = encode_prompt(self.tokenizer, text, thinking=self.thinking)
        limit = min(MAX_PROMPT_TOKENS, self.target.max_positions - 16)
        if len(ids) > limit:
            raise EngineError(f"The prompt is too long: {len(ids)} tokens, at most {limit}.")
        return ids

    @staticmethod
    def method_of(lane: str, lookup_branch: bool) -> str:
        """The decoding method a lane runs: the DART lane runs dart_pld when the lookup branch is on."""
        return DART_PLD if lane == DART and lookup_branch else lane

    def new_trace(self, method: str, prompt_ids: list[int], prompt: str, sampling: SamplingConfig,
                  max_new_tokens: int, settings: DraftSettings) -> Trace:
        """(On the model thread: the machine record may measure the cost curve.)"""
        return MODEL_THREAD.call(self.loaded.new_trace, method, prompt_ids, prompt, sampling, max_new_tokens,
                                 settings)

    def steps(self, method: str, prompt_ids: list[int], sampling: SamplingConfig, max_new_tokens: int,
              settings: DraftSettings):
        """The step generator of one lane (lazy: nothing runs before the first `next()`), each step run on the model
        thread, as is the proposer's making (it may pack the head's weights: torch's threads, or ours)."""
        config = GenerationConfig(max_new_tokens, sampling, stop_ids=self.loaded.stop_ids)
        proposer = MODEL_THREAD.call(self.loaded.proposer, method, settings)
        budget = getattr(proposer, "auto_budget", None)
        if budget is not None:
            # Where the run's verify times disagree with the curve, it is scaled for this run only, never measured
            # again: other visitors' runs keep the machine busy, and a curve measured then would replace the good
            # one (cached) for every later run.
            budget.remeasure = None
        return MODEL_THREAD.steps(generate(self.target, proposer, prompt_ids, config))

    def name_step(self, trace: Trace, step) -> None:
        """Record the text of the tokens a new step mentions (replays need no tokenizer)."""
        trace.name_tokens(self.tokenizer, step.mentioned_tokens())

    # ------------------------------------------------------------------ what-if
    def verifier(self, sampling: SamplingConfig):
        """A what-if verifier (one target forward under the lock), or None without a model."""
        if self.target is None:
            return None

        def verify(context: list[int], tree: TokenTree):
            with self.lock:
                result = MODEL_THREAD.call(verify_once, self.target, context, tree, sampling)
            return result.path, result.bonus

        return verify
