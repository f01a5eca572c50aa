"""Turning user-level names ("default", a folder, "random", "none") into a target, a proposer and a prompt.

The CLI, the benchmark and the app all build their decoding pieces here, so they behave the same.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .draft_head import DraftConfig, DraftHead, DraftHeadError
from .models import DEFAULT_MODEL, load_model_and_tokenizer, parse_dtype
from .context_ngram import ContextNGram
from .ngram import NGramModel
from .proposers import DartProposer, HeadDrafter, PromptLookupProposer, Proposer, VanillaProposer
from .target import TargetModel
from .tree_search import SearchConfig

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_HEAD = ASSETS / "smollm2-dart-head"
DEFAULT_NGRAM = ASSETS / "smollm2-ngram3.npz"
METHODS = ("dart", "vanilla", "pld", "dart_pld")  # dart_pld: DART's tree plus the prompt-lookup branch
# On a CPU a verify forward grows with the tree (fp32: 61 nodes cost ~3.5 single-token steps), so the reference's
# 60-node trees lose; 8 nodes won the sweep in docs/tree-sweep.md in both dtypes. Elsewhere: the reference's 60.
CPU_NODE_BUDGET = 8
# dart_pld's prompt-lookup branch: 5 copied tokens raised tau from 1.45 to 1.99 on HumanEval and 1.48 to 1.62 on
# MT-bench (5 + 5 prompts, 64 tokens, fp32) for 1-3 more nodes a step; 10 gained little more for twice the nodes.
LOOKUP_TOKENS = 5
# End-of-turn tokens of common chat templates: generation stops on any of them.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>")


def default_search_config(device: str = "cpu") -> SearchConfig:
    """The reference's knobs, with the node budget measured for CPUs when running on one."""
    return SearchConfig(node_budget=CPU_NODE_BUDGET) if str(device).startswith("cpu") else SearchConfig()


def load_target(model: str = DEFAULT_MODEL, device: str = "cpu", dtype: str = "fp32") -> TargetModel:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available here")
    parse_dtype(dtype)  # a clear error before the slow load
    hf_model, tokenizer = load_model_and_tokenizer(model, device=device, dtype=dtype)
    return TargetModel(hf_model, tokenizer)


def stop_ids(target: TargetModel) -> frozenset[int]:
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
    """'default' -> the shipped head; 'random' -> a seeded untrained head; else a head folder."""
    if spec in (None, "", "default"):
        if not (DEFAULT_HEAD / "config.json").is_file():
            raise DraftHeadError(f"no trained head shipped at {DEFAULT_HEAD}; pass --draft random or a head folder")
        spec = str(DEFAULT_HEAD)
    if spec == "random":
        head = DraftHead.random(DraftConfig.for_target(target.config, n_mask=n_mask), seed=seed)
    else:
        head = DraftHead.load(spec)
    head.check_target(target)
    return head.to(device=target.device, dtype=target.dtype)


def load_ngram(spec: str | None) -> NGramModel | None:
    """'none' -> no n-gram term; 'default' -> the default model's table (shipped, cached, or built once);
    else an .npz file."""
    if spec in (None, "", "none"):
        return None
    if spec == "default":
        from .ngram_build import ensure_default_ngram

        return NGramModel.load(ensure_default_ngram())
    return NGramModel.load(spec)


def check_ngram_fits(table, target: TargetModel) -> None:
    if table is not None and table.vocab_size != target.vocab_size:
        raise ValueError(f"the n-gram table has a vocabulary of {table.vocab_size}, the target {target.vocab_size}")


def build_proposer(method: str, target: TargetModel, head: DraftHead | None = None, table: NGramModel | None = None,
                   search_config: SearchConfig | None = None, pld_tokens: int = 10, pld_ngram: int = 3,
                   context_weight: float = 0.0, lookup_tokens: int | None = None) -> Proposer:
    """A proposer from pieces already loaded (the app loads them once and builds a proposer per run).
    context_weight > 0 adds the prompt's and the output's own n-grams to the table (ContextNGram);
    lookup_tokens is the length of dart_pld's prompt-lookup branch (None: LOOKUP_TOKENS)."""
    if method == "vanilla":
        return VanillaProposer()
    if method == "pld":
        return PromptLookupProposer(max_ngram=pld_ngram, num_tokens=pld_tokens)
    if method in ("dart", "dart_pld"):
        if head is None:
            raise ValueError("DART needs a draft head")
        check_ngram_fits(table, target)
        if context_weight > 0:
            table = ContextNGram(table, weight=context_weight)
        lookup = (PromptLookupProposer(max_ngram=pld_ngram, num_tokens=lookup_tokens or LOOKUP_TOKENS)
                  if method == "dart_pld" else None)
        return DartProposer(HeadDrafter(head, target), search_config, table, eos_ids=stop_ids(target), lookup=lookup)
    raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")


def make_proposer(method: str, target: TargetModel, draft: str | None = "default", ngram: str | None = "default",
                  search_config: SearchConfig | None = None, pld_tokens: int = 10, pld_ngram: int = 3,
                  context_weight: float = 0.0, lookup_tokens: int | None = None) -> Proposer:
    """Load what `method` needs (draft head, n-gram table) by name and build its proposer."""
    uses_head = method in ("dart", "dart_pld")
    head = load_draft(draft, target) if uses_head else None
    table = load_ngram(ngram) if uses_head else None
    return build_proposer(method, target, head, table, search_config, pld_tokens, pld_ngram, context_weight,
                          lookup_tokens)


def encode_prompt(target: TargetModel, text: str, raw: bool = False) -> list[int]:
    """Token ids of a user message, in the model's chat template when it has one (unless raw)."""
    if not text or not text.strip():
        raise ValueError("the prompt is empty")
    tok = target.tokenizer
    if tok is None:
        raise ValueError("the target has no tokenizer")
    if not raw and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tok(text)["input_ids"]]
