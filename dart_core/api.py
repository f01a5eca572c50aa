"""DART Lab from Python, on one page.

    import dart_core

    lab = dart_core.load()                                  # the embedded default model, its head and n-gram table
    result = lab.generate("Write a haiku about the sea.", method="dart", max_new_tokens=64)
    print(result.text, result.metrics.tau, result.metrics.tokens_per_s)
    for step in lab.stream("Name three rivers.", method="dart_pld"):   # one StepRecord per target forward
        print(step.new_tokens, step.accepted)
    result.trace.save("run.json.gz")                        # every step, for the app's replay or `dart-lab report`

`load` takes the names the command line takes (a model folder, a GGUF file, a head folder, 'random', 'none', ...).
Methods: 'vanilla' (plain decoding), 'pld' (prompt lookup), 'dart', 'dart_pld'. Greedy fp32 output is the target's
own, whichever method; a knob left out keeps the command line's default (the automatic node budget among them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from .acceptance import SamplingConfig
from .decoding import GenerationConfig, generate
from .methods import DART, METHODS, uses_head
from .metrics import Metrics
from .errors import ConfigError
from .setup.chat import encode_prompt
from .setup.defaults import default_search_config
from .setup.loading import DraftSettings, Loaded
from .setup.loading import load as load_pieces
from .trace import StepRecord, Trace


@dataclass
class Result:
    """A finished decode: its text, token ids, every step (the trace) and the figures over them."""
    text: str
    token_ids: list[int]
    trace: Trace
    metrics: Metrics


class Lab:
    """A loaded target with DART's head and n-gram table, ready to decode prompts by any method."""

    def __init__(self, loaded: Loaded):
        self.loaded = loaded
        self.target = loaded.target
        self.tokenizer = loaded.target.tokenizer

    def stream(self, prompt: str | list[int], method: str = DART, max_new_tokens: int = 128,
               temperature: float = 0.0, **knobs) -> Iterator[StepRecord]:
        """Decode `prompt` (a user message, or token ids as they are), yielding the prefill's record and then one per
        verify step. knobs: SearchConfig's fields (node_budget=16, beam_width=..., ...); node_budget='auto' (the
        default) sizes each tree from this machine's measured costs."""
        ids, sampling, settings = self._prepare(prompt, method, temperature, knobs)
        yield from self._decode(ids, method, max_new_tokens, sampling, settings)

    def generate(self, prompt: str | list[int], method: str = DART, max_new_tokens: int = 128,
                 temperature: float = 0.0, **knobs) -> Result:
        """Decode `prompt` to the end (see `stream`); the result holds the trace of every step."""
        ids, sampling, settings = self._prepare(prompt, method, temperature, knobs)
        prompt_text = prompt if isinstance(prompt, str) else ""
        trace = self.loaded.new_trace(method, ids, prompt_text, sampling, max_new_tokens, settings)
        trace.steps.extend(self._decode(ids, method, max_new_tokens, sampling, settings))
        out = trace.output_ids
        text = self.tokenizer.decode(out, skip_special_tokens=True) if self.tokenizer is not None else ""
        return Result(text, out, trace, Metrics.from_steps(trace.steps))

    def encode(self, prompt: str | list[int]) -> list[int]:
        """A user message in the model's chat template, or token ids unchanged."""
        if isinstance(prompt, str):
            return encode_prompt(self.tokenizer, prompt)
        if not prompt:
            raise ConfigError("the prompt is empty")
        return [int(t) for t in prompt]

    def _prepare(self, prompt, method: str, temperature: float, knobs: dict):
        """The prompt's ids, the sampling and the drafting settings of a call, checked before anything decodes."""
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
        if uses_head(method) and self.loaded.head is None:
            raise ConfigError(f"{method} needs a draft head: load with draft='default', a head folder or 'random'")
        return self.encode(prompt), SamplingConfig(temperature).validate(), self._settings(knobs)

    def _decode(self, ids: list[int], method: str, max_new_tokens: int, sampling: SamplingConfig,
                settings: DraftSettings) -> Iterator[StepRecord]:
        config = GenerationConfig(max_new_tokens, sampling, stop_ids=self.loaded.stop_ids).validate()
        return generate(self.target, self.loaded.proposer(method, settings), ids, config)

    def _settings(self, knobs: dict) -> DraftSettings:
        auto = knobs.get("node_budget", "auto") == "auto"
        fields = {k: v for k, v in knobs.items() if not (k == "node_budget" and auto)}
        try:
            search = replace(default_search_config(str(self.target.device)), **fields).validate()
        except TypeError as exc:
            raise ConfigError(f"unknown knob: {exc}") from None
        return DraftSettings(search, auto)


def load(model: str = "default", draft: str | None = "default", ngram: str | None = "default", device: str = "cpu",
         dtype: str = "auto") -> Lab:
    """The target by name with DART's head and n-gram table (draft=None: plain decoding and lookup only)."""
    return Lab(load_pieces(model, draft, ngram, device, dtype, with_head=draft is not None))
