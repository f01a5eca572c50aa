"""What one training step computes of its sequences: each sequence's anchors and the target's distributions its
rows are scored against, the head's logits for a batch of sequences in one forward, and the rows' acceptance
statistics, kept on the device until the host reads them."""

from __future__ import annotations

import random

import torch

from ..target import TargetModel
from .records import AnchorBatch, RowStats, SequenceExample


def sequence_batch(seq: SequenceExample, n_rows: int, n_anchors: int, rng: random.Random,
                   t2d: torch.Tensor | None) -> AnchorBatch | None:
    """Anchors and targets for one sequence (None: no anchor in it). Row r of anchor p predicts the token at p+2+r,
    whose target distribution is the target's output at position p+1+r."""
    T, start = seq.ids.numel(), seq.prompt_len - 1
    valid = list(range(max(start, 0), T - 2))  # anchor p: committed through p, the root x_{p+1} is a response token
    if not valid:
        return None
    anchors = torch.tensor(sorted(rng.sample(valid, min(n_anchors, len(valid)))))
    pos = anchors[:, None] + 1 + torch.arange(n_rows)[None]          # [A, R]
    row_ok = pos <= T - 1
    pos = pos.clamp(max=T - 1)
    label_ids = seq.label_ids.long()[pos]                              # [A, R, k]
    label_probs = seq.label_probs.float()[pos]
    if t2d is not None:
        label_ids = t2d[label_ids]
        label_probs = label_probs * (label_ids >= 0)
        label_ids = label_ids.clamp_min(0)
    argmax_in_vocab = label_probs[..., 0] > 0
    label_probs = label_probs / label_probs.sum(-1, keepdim=True).clamp_min(1e-8)
    mass_ok = label_probs.sum(-1) > 0
    return AnchorBatch(anchors, label_ids, label_probs, weight_mask=row_ok & mass_ok, argmax=label_ids[..., 0],
                       argmax_ok=row_ok & argmax_in_vocab, row_ok=row_ok,
                       real=torch.ones(anchors.shape[0], dtype=torch.bool))


def head_logits(forward, target: TargetModel, seqs: list[SequenceExample], anchors: torch.Tensor,
                on_device: torch.Tensor) -> torch.Tensor:
    """The head's logits [B, A, R, Vd] for the anchors [B, A] (on the host; `on_device`: the same already copied to
    the training device) of B sequences (padded: AnchorBatch.stack), each as `DraftHead.forward_train` gives them (a
    trained head has its own output layer). forward: a TrainingForward of the head (or its DDP wrapper). The inputs
    are gathered on the host and sent in one copy of each kind, which a GPU does not wait for."""
    device = target.device
    ends = anchors.max(dim=1).values + 1   # positions past a sequence's last anchor are never attended to
    n = int(ends.max())
    feats = torch.zeros(len(seqs), n, seqs[0].features.shape[1], dtype=seqs[0].features.dtype)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    for b, (seq, end) in enumerate(zip(seqs, ends.tolist())):
        feats[b, :end] = seq.features[:end]
        ids[b, :end] = seq.ids[1:end + 1]   # position i: token i+1
    past_end = (torch.arange(n) >= ends[:, None])[..., None]
    with torch.no_grad():
        embeds = target.embed_tokens(ids.to(device, non_blocking=True)).float()
        embeds = embeds.masked_fill_(past_end.to(device, non_blocking=True), 0.0)
    return forward(feats.to(device, non_blocking=True).float(), embeds, on_device)


def row_stats(logits: torch.Tensor, batch: AnchorBatch) -> RowStats:
    """Per-row top-1 hits, and per-anchor consecutive-correct counts for top-1 and top-3 (over every sequence of a
    stacked batch), as tensors where the logits are: the host reads them once a step or an evaluation."""
    R, V = logits.shape[-2:]
    top3 = logits.reshape(-1, R, V).topk(3, dim=-1).indices            # [A, R, 3]
    full = batch.row_ok.reshape(-1, R).all(-1)                         # anchors with every row inside the text
    counted = batch.argmax_ok.reshape(-1, R) & full[:, None]           # masks, not indexing: no wait for a count
    argmax = batch.argmax.reshape(-1, R)
    hit1 = (top3[..., 0] == argmax) & counted
    hit3 = (top3 == argmax[..., None]).any(-1) & counted
    chain1 = hit1.int().cumprod(-1).sum(-1)                            # 0 for the anchors left out
    chain_hist = torch.zeros(R + 1, device=logits.device).index_add_(0, chain1, full.float())
    return RowStats(hit1.float().sum(0), full.sum().float(), chain1.sum().float(),
                    hit3.int().cumprod(-1).sum(-1).sum().float(), chain_hist)
