"""Tiny random target models and drafters, built in memory (no downloads): what the tests and the device check
decode with, and the lossless yardstick they compare against (plain_greedy_reference)."""

from __future__ import annotations

import random

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, Qwen2Config, Qwen3Config

from ..draft_head import DraftConfig, DraftHead
from ..proposers import Drafter
from ..target import TargetModel

CONFIGS = {
    "llama": LlamaConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
}


def random_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n prompts of 3-22 token ids below `vocab` (none of the first three: pad, bos, eos), each with some of its start
    repeated, so that prompt lookups can hit."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 12))]
        out.append(base + base[: rng.randrange(0, len(base))])
    return out


def tiny_target(family: str = "llama", vocab: int = 96, hidden: int = 64, layers: int = 6, seed: int = 0,
                dtype=torch.float32, max_positions: int = 512, tie: bool = True, device: str = "cpu") -> TargetModel:
    torch.manual_seed(seed)
    cfg = CONFIGS[family](
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=max_positions,
        tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype)
    # Random init gives near-uniform logits; sharpen them so greedy paths have structure (and real ties are rare).
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return TargetModel(model.to(device).eval())


def random_head(target: TargetModel, n_mask: int = 3, seed: int = 0, **overrides) -> DraftHead:
    cfg = DraftConfig.for_target(target.config, n_mask=n_mask, **overrides)
    return DraftHead.random(cfg, seed=seed).to(target.dtype)


class OracleDrafter(Drafter):
    """Drafts exactly the target's own greedy continuation (cheating, for testing the upper bound of tau)."""

    def __init__(self, target: TargetModel, n_rows: int = 4):
        self.target, self.n_rows = target, n_rows

    @torch.inference_mode()
    def draft(self, context, new_features):
        ids = list(context)
        rows = torch.full((self.n_rows, self.target.vocab_size), -30.0)
        for r in range(self.n_rows):
            logits = self.target.model(input_ids=torch.tensor([ids])).logits[0, -1]
            tok = int(logits.argmax())
            rows[r, tok] = 30.0
            ids.append(tok)
        return rows


class TargetDrafter(Drafter):
    """Drafts the target's own next-token logits along its greedy continuation: row r holds the target's logits
    after the context and r greedy tokens. The drafts carry the target's uncertainty, so under sampling they are
    often accepted and sometimes rejected. Rows are memoised per context (the target must not change meanwhile)."""

    def __init__(self, target: TargetModel, n_rows: int = 2):
        self.target, self.n_rows = target, n_rows
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.inference_mode()
    def draft(self, context, new_features):
        key = tuple(context)
        if key not in self._rows:
            ids, rows = list(context), []
            for _ in range(self.n_rows):
                logits = self.target.model(input_ids=torch.tensor([ids])).logits[0, -1]
                rows.append(logits)
                ids.append(int(logits.argmax()))
            self._rows[key] = torch.stack(rows)
        return self._rows[key]


class NoisyDrafter(TargetDrafter):
    """The target's own rows blurred by seeded noise: the wanted token lands at all sorts of ranks."""

    def __init__(self, target, n_rows=3, noise=4.0):
        super().__init__(target, n_rows)
        self.gen, self.noise = torch.Generator().manual_seed(0), noise

    def draft(self, context, new_features):
        rows = super().draft(context, new_features)
        return rows + self.noise * torch.randn(rows.shape, generator=self.gen)


def plain_greedy_reference(target: TargetModel, prompt_ids: list[int], max_new_tokens: int,
                           stop_ids=frozenset()) -> list[int]:
    """Token-by-token greedy decoding with transformers' own cache handling (the lossless yardstick in tests)."""
    ids = torch.tensor([prompt_ids], device=target.device)
    cache = DynamicCache(config=target.config)   # transformers' own, whatever forward the target decodes with
    out: list[int] = []
    with torch.inference_mode():
        logits = target.model(input_ids=ids, **{target.cache_kwarg: cache}, use_cache=True).logits[0, -1]
        for _ in range(max_new_tokens):
            tok = int(logits.argmax())
            out.append(tok)
            if tok in stop_ids:
                break
            logits = target.model(input_ids=torch.tensor([[tok]], device=target.device),
                                  **{target.cache_kwarg: cache}, use_cache=True).logits[0, -1]
    return out
