"""The chat template, in one place: prompts for decoding, conversations for training and for n-gram tables."""

from __future__ import annotations

from ..errors import DartError


class PromptError(DartError):
    """An empty prompt, or a model without a tokenizer."""


def chat_ids(tokenizer, turns: list[dict], add_generation_prompt: bool, thinking: bool = False) -> list[int]:
    """Token ids of `turns` ({"role", "content"} dicts) in the tokenizer's chat template.

    thinking: Qwen3's templates (and others that read `enable_thinking`) open a reasoning block unless it is off;
    it is off by default, as in the DART authors' evaluation. Templates without the switch ignore it."""
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        return_dict=False, enable_thinking=thinking)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def chat_text(tokenizer, turns: list[dict]) -> str:
    """A whole conversation as text in the chat template (plain concatenation of turns without one)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(turns, tokenize=False)
    return "\n\n".join(t["content"] for t in turns)


def encode_prompt(tokenizer, text: str, raw: bool = False, thinking: bool = False) -> list[int]:
    """Token ids of a user message, in the model's chat template when it has one (unless raw)."""
    if not text or not text.strip():
        raise PromptError("the prompt is empty")
    if tokenizer is None:
        raise PromptError("the target has no tokenizer")
    if not raw and getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, [{"role": "user", "content": text}], add_generation_prompt=True, thinking=thinking)
    return [int(t) for t in tokenizer(text)["input_ids"]]
