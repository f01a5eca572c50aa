"""The chat template switch for Qwen3's reasoning block, and the stop ids of a Qwen3-style vocabulary."""

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dart_core.setup.chat import encode_prompt
from dart_core.setup.loading import stop_ids
from dart_core.setup.tiny_models import tiny_target

WORDS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "user", "assistant", "hi", "there"]

# A template in Qwen3's manner: with thinking off, the assistant turn starts with an empty reasoning block.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m.role }} {{ m.content }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant "
    "{% if enable_thinking is defined and not enable_thinking %}<think> </think> {% endif %}{% endif %}")
PLAIN_TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m.role }} {{ m.content }} <|im_end|> {% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def qwen_style_tokenizer(template: str) -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = template
    return tok


def words(tok, ids):
    return [WORDS[i] for i in ids]


def test_thinking_is_off_by_default_and_can_be_turned_on():
    tok = qwen_style_tokenizer(THINKING_TEMPLATE)
    off = words(tok, encode_prompt(tok, "hi there"))
    on = words(tok, encode_prompt(tok, "hi there", thinking=True))
    assert off == ["<|im_start|>", "user", "hi", "there", "<|im_end|>", "<|im_start|>", "assistant", "<think>",
                   "</think>"]
    assert on == off[:-2]
    assert words(tok, encode_prompt(tok, "hi there", raw=True)) == ["hi", "there"]


def test_a_template_without_the_switch_ignores_it():
    tok = qwen_style_tokenizer(PLAIN_TEMPLATE)
    assert encode_prompt(tok, "hi") == encode_prompt(tok, "hi", thinking=True)


def test_stop_ids_of_a_qwen3_vocabulary():
    target = tiny_target("qwen3", vocab=len(WORDS), hidden=32, layers=4)
    target.tokenizer = qwen_style_tokenizer(THINKING_TEMPLATE)
    target.model.generation_config.eos_token_id = [WORDS.index("<|im_end|>"), WORDS.index("<|endoftext|>")]
    target.config.eos_token_id = WORDS.index("<|im_end|>")
    assert {WORDS.index("<|im_end|>"), WORDS.index("<|endoftext|>")} <= stop_ids(target)
    assert WORDS.index("</think>") not in stop_ids(target)
