"""A new head's start from its target and its data: the draft vocabulary (the tokens the target most often
answers with), the output layer taken from the target's, the feature statistics, and a vocabulary grown on resume."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..draft_head import DraftHead
from ..target import TargetModel
from .records import SequenceExample


def choose_draft_vocab(seqs: list[SequenceExample], size: int, must_include=(),
                       corpus_counts: torch.Tensor | None = None) -> torch.Tensor:
    """The `size` most frequent target-argmax tokens of the responses (plus stop ids), as d2t: draft -> target.

    corpus_counts ([V] token counts of a large corpus, e.g. the n-gram table's unigrams) are added, scaled to the
    same total, so that a small sample of sequences does not decide the whole vocabulary."""
    vocab = max(int(max(int(s.label_ids.max()) for s in seqs)) + 1,
                0 if corpus_counts is None else corpus_counts.numel())
    counts = torch.zeros(vocab, dtype=torch.float64)
    for s in seqs:
        counts += torch.bincount(s.response_argmax(), minlength=vocab)[:vocab].double()
    if corpus_counts is not None and corpus_counts.sum() > 0:
        counts[: corpus_counts.numel()] += corpus_counts.double() * (counts.sum() / corpus_counts.sum())
    order = torch.argsort(counts, descending=True, stable=True)
    chosen = list(dict.fromkeys(int(t) for t in must_include))
    for t in order.tolist():
        if len(chosen) >= size:
            break
        if t not in chosen:
            chosen.append(t)
    return torch.tensor(sorted(chosen[:size]), dtype=torch.long)


def vocab_coverage(seqs: list[SequenceExample], d2t: torch.Tensor, vocab_size: int) -> float:
    """Share of the responses' target-argmax tokens that the draft vocabulary contains."""
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[d2t] = True
    hit = total = 0
    for s in seqs:
        labels = s.response_argmax()
        hit += int(inside[labels].sum())
        total += labels.numel()
    return hit / max(total, 1)


@torch.no_grad()
def init_from_target(head: DraftHead, target: TargetModel) -> None:
    """Start the draft layer as a copy of the target's last decoder layer (the feature half of q/k/v)."""
    H = head.config.hidden_size
    last = target.layers[-1]
    attn, mlp = last.self_attn, last.mlp
    for name in ("q_proj", "k_proj", "v_proj"):
        src = getattr(attn, name).weight
        dst = getattr(head, name).weight
        if dst.shape == (src.shape[0], 2 * H):
            dst[:, H:].copy_(src)
            dst[:, :H].normal_(std=0.02)
    if head.o_proj.weight.shape == attn.o_proj.weight.shape:
        head.o_proj.weight.copy_(attn.o_proj.weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        if getattr(head, name).weight.shape == getattr(mlp, name).weight.shape:
            getattr(head, name).weight.copy_(getattr(mlp, name).weight)
    head.post_attn_norm.weight.copy_(last.post_attention_layernorm.weight)
    if head.config.double_norm:
        head.final_norm.weight.fill_(1.0)   # the target's norm weight goes into the output rows instead
    else:
        head.final_norm.weight.copy_(target.model.model.norm.weight)
    if head.lm_head is not None:
        head.lm_head.weight.copy_(target_output_rows(head, target, head.d2t))


@torch.no_grad()
def target_output_rows(head: DraftHead, target: TargetModel, d2t: torch.Tensor | None) -> torch.Tensor:
    """The target's output rows for the draft vocabulary `d2t`, as the head's output layer starts. A double-norm
    head starts with a unit norm weight and the target's norm weight folded into these rows: its logits
    lm_head(n(n(h))) are then the target's lm_head(norm(h)) (up to eps), as a single-norm head's start."""
    weight = target.lm_head.weight
    rows = weight if d2t is None else weight[d2t.to(weight.device)]
    if head.config.double_norm:
        rows = rows * target.model.model.norm.weight.to(rows.dtype)[None]
    return rows.to(head.lm_head.weight.device, head.lm_head.weight.dtype)


@torch.no_grad()
def grow_draft_vocab(head: DraftHead, target: TargetModel, d2t: torch.Tensor) -> DraftHead:
    """A copy of `head` over the larger draft vocabulary `d2t` (sorted target ids, a superset of head.d2t).
    Learned output rows are kept; rows of new tokens start as the target's output rows, as at init."""
    old, d2t = head.d2t, d2t.to(head.d2t.device)
    if not bool(torch.isin(old, d2t).all()):
        raise ValueError("the new draft vocabulary must contain the old one")
    grown = DraftHead(replace(head.config, draft_vocab_size=len(d2t))).to(old.device)
    state = {k: v for k, v in head.state_dict().items() if k not in ("d2t", "lm_head.weight")}
    grown.load_state_dict(state, strict=False)
    grown.d2t.copy_(d2t)
    rows = target_output_rows(grown, target, d2t)
    rows[torch.searchsorted(d2t, old)] = head.lm_head.weight
    grown.lm_head.weight.copy_(rows)
    return grown


@torch.no_grad()
def set_feature_stats(head: DraftHead, seqs: list[SequenceExample], sample: int = 200, center: bool = True) -> None:
    """Per-dimension feature standardisation from the first `sample` sequences: (x - mean) / std, or without a
    mean (center=False) x / rms, which folds into fc exactly (the authors' format has no bias for a mean)."""
    feats = torch.cat([s.features.float() for s in seqs[:sample]])
    if center:
        head.feature_mean.copy_(feats.mean(0))
        head.feature_std.copy_(feats.std(0).clamp_min(1e-3))
    else:
        head.feature_mean.zero_()
        head.feature_std.copy_(feats.pow(2).mean(0).sqrt().clamp_min(1e-3))
