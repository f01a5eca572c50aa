"""The head's loss: soft cross-entropy of each row's logits against the target's top-k distribution, its forward and
gradient computed a chunk of rows at a time."""

from __future__ import annotations

import torch

from .records import AnchorBatch


LOSS_CHUNK_ROWS = 128  # rows of logits per pass on a CPU: their float copy stays in cache (one pass over [A, R, Vd]
                       # is memory-bound on these CPUs: 3x faster in chunks, measured in docs/training.md)
LOSS_CHUNK_ROWS_GPU = 16384   # on a GPU each pass costs kernel launches and memory is ample: a batch in one or two


def loss_chunk_rows(logits: torch.Tensor) -> int:
    """Rows of logits per pass of the loss and its gradient, where they run."""
    return LOSS_CHUNK_ROWS if logits.device.type == "cpu" else LOSS_CHUNK_ROWS_GPU


class SoftCrossEntropy(torch.autograd.Function):
    """-sum_j p_j log softmax(z)_j per row, for labels given as top-k (ids, probs), written as
    sum(p) * logsumexp(z) - sum_j p_j z_j; its gradient is softmax(z) * sum(p) - p (scattered). Both are made a
    chunk of rows at a time: autograd's log_softmax, gather and their backwards make five full-size float tensors."""

    @staticmethod
    def forward(ctx, logits, ids, probs):
        flat, chunk = logits.reshape(-1, logits.shape[-1]), loss_chunk_rows(logits)
        lse = torch.cat([torch.logsumexp(flat[i:i + chunk].float(), dim=-1)
                         for i in range(0, flat.shape[0], chunk)]).view(logits.shape[:-1])
        ctx.save_for_backward(logits, lse, ids, probs)
        return probs.sum(-1) * lse - (probs * logits.gather(-1, ids).float()).sum(-1)

    @staticmethod
    def backward(ctx, grad):
        logits, lse, ids, probs = ctx.saved_tensors
        V, k = logits.shape[-1], ids.shape[-1]
        flat, shift = logits.reshape(-1, V), lse.reshape(-1, 1)
        scale = (probs.sum(-1) * grad).reshape(-1, 1)
        ids, minus_p = ids.reshape(-1, k), (-probs * grad[..., None]).reshape(-1, k)
        out = torch.empty_like(flat)
        chunk = loss_chunk_rows(logits)
        for i in range(0, flat.shape[0], chunk):
            rows = slice(i, i + chunk)
            # out of place first: for fp32 logits `.float()` is the saved tensor itself, which must stay unchanged
            g = (flat[rows].float() - shift[rows]).exp_().mul_(scale[rows])
            out[rows] = g.scatter_add_(-1, ids[rows], minus_p[rows])   # in float: rounded once, as autograd's
        return out.view(logits.shape), None, None


def soft_ce(logits: torch.Tensor, batch: AnchorBatch, row_weights: torch.Tensor) -> torch.Tensor:
    """A sequence's loss: the mean over its scored rows of each row's soft cross-entropy, row r weighted
    row_weights[r]. A scalar, or [B] for a stacked batch (each sequence's own mean)."""
    per = SoftCrossEntropy.apply(logits, batch.label_ids, batch.label_probs)  # [..., A, R]
    w = row_weights * batch.weight_mask
    return (per * w).sum((-2, -1)) / w.sum((-2, -1)).clamp_min(1e-8)
