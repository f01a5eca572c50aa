"""The draft head's training forward, computed only where the loss looks: the same logits as
`DraftHead.forward_train`, at a fraction of its cost.

`forward_train` runs one block-masked attention over every real position and every anchor's K mask slots
(n = T + A*K rows, an n x n mask). But the head is one layer, and the loss reads only the anchors' rows and their
slots, so here:
- queries are computed only for the anchors and the slots (A*(K+1) rows, not n);
- every slot's input is the same mask vector, so q/k/v of a slot are one projection, rotated per position;
- each query attends to the real keys (all T, masked to <= its anchor) and to the K slot keys of its own block
  (a [A, K+1, K] tensor), never to the other A*K - K slots that the n x n mask hides anyway.
Several sequences go through one forward along a batch axis (padded to the longest), so that a GPU gets work enough.
"""

from __future__ import annotations

import torch

from ..draft_head import DraftHead, rope


def _heads(x: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """[B, rows, n_heads*head_dim] -> [B, n_heads, rows, head_dim]."""
    return x.view(x.shape[0], x.shape[1], n_heads, head_dim).transpose(1, 2)


def _block_mask(A: int, K: int, device) -> torch.Tensor:
    """[A, K+1, K]: row 0 (the anchor) sees no slot; slot row r (1..K) sees slots 0..r-1 of its own block."""
    rows = torch.arange(K + 1, device=device)[:, None]
    return (torch.arange(K, device=device)[None] < rows)[None].expand(A, K + 1, K)


def _attention(q, k_real, v_real, k_slot, v_slot, anchors, rep: int):
    """q: [B, Hq, A*(K+1), d] (per anchor: its own row, then its K slots); k/v_real: [B, Hk, T, d];
    k/v_slot: [B, Hk, A*K, d]; anchors [B, A]. Softmax over the real keys <= anchor and the block's earlier slots."""
    B, Hk, T, d = k_real.shape
    A = anchors.shape[1]
    K = k_slot.shape[2] // A
    qg = q.reshape(B, Hk, rep * A * (K + 1), d) * d ** -0.5            # query heads grouped by their kv head
    real = (qg @ k_real.transpose(-1, -2)).view(B, Hk, rep, A, K + 1, T)
    seen = torch.arange(T, device=q.device) <= anchors[..., None]       # [B, A, T]
    real = real.masked_fill(~seen[:, None, None, :, None], float("-inf"))
    qb = qg.reshape(B, Hk, rep, A, K + 1, d)
    block = qb @ k_slot.reshape(B, Hk, 1, A, K, d).transpose(-1, -2)    # [B, Hk, rep, A, K+1, K]
    block = block.masked_fill(~_block_mask(A, K, q.device), float("-inf"))
    p = torch.cat([real, block], dim=-1).softmax(-1).to(v_real.dtype)
    out = (p[..., :T].reshape(B, Hk, rep * A * (K + 1), T) @ v_real).view(B, Hk, rep, A, K + 1, d)
    out = out + p[..., T:] @ v_slot.reshape(B, Hk, 1, A, K, d)
    return out.reshape(B, Hk * rep, A * (K + 1), d)


def train_logits(head: DraftHead, features: torch.Tensor, embeds: torch.Tensor, anchors: torch.Tensor
                 ) -> torch.Tensor:
    """The logits [A, K+1, Vd] of `head.forward_train(features, embeds, anchors)` (a head with its own output
    layer). features: [T, 3H], embeds: [T, H]; anchors: [A] sorted positions < T.

    Or of B sequences in one forward (what fills a GPU: one sequence's forward is too small for it): features
    [B, T, 3H], embeds [B, T, H], anchors [B, A] -> logits [B, A, K+1, Vd], each sequence's as it alone would get
    them. Sequences shorter than T are padded at their end (an anchor never sees past itself); so are their
    anchors, by any position < T, whose rows the loss leaves out."""
    if features.dim() == 2:
        return train_logits(head, features[None], embeds[None], anchors[None])[0]
    c = head.config
    K, (B, A), hd, dev = c.n_mask, anchors.shape, c.head_dim, features.device
    x, g = head._input(features, embeds)                                # [B, T, 2H], [B, T, H]
    T = x.shape[1]
    slot_pos = anchors[..., None] + 1 + torch.arange(K, device=dev)     # [B, A, K]
    q_pos = torch.cat([anchors[..., None], slot_pos], dim=-1).reshape(B, A * (K + 1))
    mask_x = head.mask_embed.to(x.dtype)[None]
    q_anchor = head.q_proj(_at(x, anchors))                             # [B, A, Hq*d]
    q_mask = head.q_proj(mask_x)                                        # [1, Hq*d], the same for every slot
    q_rows = torch.cat([q_anchor[:, :, None], q_mask.expand(B, A, K, -1).to(q_anchor.dtype)], dim=2)
    q = rope(_heads(q_rows.reshape(B, A * (K + 1), -1), c.num_heads, hd), q_pos, c.rope_theta)
    k_real = rope(_heads(head.k_proj(x), c.num_kv_heads, hd), torch.arange(T, device=dev), c.rope_theta)
    v_real = _heads(head.v_proj(x), c.num_kv_heads, hd)
    k_mask, v_mask = head.k_proj(mask_x), head.v_proj(mask_x)
    k_slot = rope(_heads(k_mask.expand(B, A * K, -1), c.num_kv_heads, hd), slot_pos.reshape(B, A * K),
                  c.rope_theta)
    v_slot = _heads(v_mask.expand(B, A * K, -1), c.num_kv_heads, hd)
    attn = _attention(q, k_real, v_real.to(q.dtype), k_slot.to(q.dtype), v_slot.to(q.dtype), anchors,
                      c.num_heads // c.num_kv_heads)
    out = head.o_proj(attn.transpose(1, 2).reshape(B, A * (K + 1), -1))
    slot_residual = head.mask_embed[: c.hidden_size].to(g.dtype).expand(B, A, K, -1)
    residual = torch.cat([_at(g, anchors)[:, :, None], slot_residual], dim=2)   # [B, A, K+1, H]
    return head._mlp_and_logits(residual + out.view(B, A, K + 1, -1).to(residual.dtype), None)


def _at(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [B, T, C] at positions [B, A] -> [B, A, C]."""
    return x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1]))


class TrainingForward(torch.nn.Module):
    """`train_logits` of a head as a module's forward, so that DistributedDataParallel (which all-reduces the
    gradients of what its wrapped module's forward computed) can wrap it; the head stays the one trained."""

    def __init__(self, head: DraftHead):
        super().__init__()
        self.head = head

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        return train_logits(self.head, features, embeds, anchors)
