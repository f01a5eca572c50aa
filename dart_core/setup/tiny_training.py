"""A tiny Qwen3 target saved as a transformers folder (random weights, a word-level tokenizer with a Qwen3-style
chat template and its thinking switch) and a file of chats for it: what `python -m dart_core train --model DIR
--chats FILE` needs, built without downloads. The tests and the device check train on them."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from .tiny_models import tiny_target

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "system", "user", "assistant"]
VOCAB = 96
WORDS = SPECIAL + [f"w{i}" for i in range(VOCAB - len(SPECIAL))]

# As Qwen3's: replies after the last user turn open with an (empty) reasoning block, and so does the generation
# prompt when thinking is off; the prompt is then a prefix of the conversation with its reply.
TEMPLATE = (
    "{% set ns = namespace(last=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|> {{ m.role }} "
    "{% if m.role == 'assistant' and loop.index0 > ns.last %}<think> </think> {% endif %}"
    "{{ m.content }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant "
    "{% if enable_thinking is defined and not enable_thinking %}<think> </think> {% endif %}{% endif %}")


def word_tokenizer() -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = TEMPLATE
    return tok


def save_tiny_qwen3(folder, seed: int = 5):
    """The tiny Qwen3 target (8 layers: the authors' three taps are distinct) written as a model folder; returns
    the target as loaded in memory."""
    target = tiny_target("qwen3", vocab=VOCAB, hidden=64, layers=8, seed=seed)
    target.model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return target


def random_text(rng: random.Random, low: int, high: int) -> str:
    """low to high words of the tiny vocabulary, none of them special."""
    return " ".join(rng.choice(WORDS[len(SPECIAL):]) for _ in range(rng.randint(low, high)))


def write_chats(path, n: int, seed: int = 0) -> Path:
    """n conversations, one per line: most in the "messages" shape (some with a system turn, some with two
    exchanges), every fourth in ShareGPT's "conversations" shape."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        turns = [("user", random_text(rng, 3, 8)), ("assistant", random_text(rng, 12, 30))]
        if i % 3 == 1:
            turns = [("system", random_text(rng, 2, 4)), *turns]
        if i % 5 == 2:
            turns += [("user", random_text(rng, 2, 5)), ("assistant", random_text(rng, 8, 16))]
        if i % 4 == 3:
            names = {"user": "human", "assistant": "gpt", "system": "system"}
            lines.append({"conversations": [{"from": names[r], "value": t} for r, t in turns]})
        else:
            lines.append({"messages": [{"role": r, "content": t} for r, t in turns]})
    path = Path(path)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path
