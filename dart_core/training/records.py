"""The records training passes between its steps, typed: a sequence's example (what the target says along it), one
sequence's anchor batch (what the loss scores), the row statistics of a forward, and a held-out evaluation.

Files keep their formats: an example is stored in the feature cache as the dict `to_dict` gives (cache files written
before these types load as they are), and an evaluation goes into metrics.json, the checkpoint and the run's
history as the dict `to_dict` gives.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import torch


@dataclass
class SequenceExample:
    """One training sequence: its tokens, where the response starts, the target's features on it and the target's
    own top-k next-token distribution at every position (data.sequence_examples)."""
    ids: torch.Tensor             # [T] int32
    prompt_len: int
    features: torch.Tensor        # [T, 3H] bf16: the target's three feature taps
    label_ids: torch.Tensor       # [T, k] int32: the target's top-k tokens after each position
    label_probs: torch.Tensor     # [T, k] fp16: their probabilities

    def response_argmax(self) -> torch.Tensor:
        """The target's argmax after each position from the last prompt token on: the tokens a head drafts."""
        return self.label_ids[self.prompt_len - 1:, 0].long()

    def to_dict(self) -> dict:
        """As the feature cache stores it (torch.save of a dict of tensors and an int, read with weights_only)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "SequenceExample":
        return cls(**{f.name: d[f.name] for f in fields(cls)})


@dataclass
class AnchorBatch:
    """One sequence's anchors and what each of their rows is scored against (anchors.sequence_batch): row r of
    anchor p predicts the token at p+2+r, whose target distribution is the target's output at position p+1+r.
    Several sequences' batches `stack` into one, every field with a leading axis B, padded to the most anchors."""
    anchors: torch.Tensor         # [A] positions, sorted
    label_ids: torch.Tensor       # [A, R, k] draft-vocabulary ids of the target's top k
    label_probs: torch.Tensor     # [A, R, k] their probabilities, renormalised over the draft vocabulary
    weight_mask: torch.Tensor     # [A, R] rows the loss scores: inside the text, with label mass in the vocabulary
    argmax: torch.Tensor          # [A, R] the target's top token (draft id)
    argmax_ok: torch.Tensor       # [A, R] inside the text, and the top token in the draft vocabulary
    row_ok: torch.Tensor          # [A, R] inside the text
    real: torch.Tensor            # [A] an anchor of the text (False: padding of a stack, every mask False)

    def to(self, device: torch.device) -> "AnchorBatch":
        """On `device`, copied without waiting for it (from the host, a GPU's queue goes on)."""
        return replace(self, **{f.name: getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)})

    @classmethod
    def stack(cls, batches: list["AnchorBatch"]) -> "AnchorBatch":
        """The batches of B sequences as one [B, A_max, ...]; padding: anchor 0, zero labels, every mask False."""
        most = max(b.anchors.shape[0] for b in batches)

        def padded(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, t.new_zeros((most - t.shape[0], *t.shape[1:]))]) if t.shape[0] < most else t
        return cls(**{f.name: torch.stack([padded(getattr(b, f.name)) for b in batches]) for f in fields(cls)})


def minutes_trained(sessions: list[dict]) -> float:
    """A run's training time: its sessions' own minutes (the checkpoint's and metrics.json's "sessions"), summed."""
    return sum(session.get("minutes", 0.0) for session in sessions)


@dataclass
class RowStats:
    """Per-row top-1 hits and per-anchor consecutive-correct counts of a forward (anchors.row_stats), over the
    anchors whose every row lies inside the text, as float tensors where the forward ran; stats of several forwards
    add up with +."""
    hit1: torch.Tensor            # [R] anchors whose row r's top-1 is the target's argmax
    rows: torch.Tensor            # anchors counted
    chain1: torch.Tensor          # summed over anchors: rows accepted by a greedy chain (top-1 of each row)
    chain3: torch.Tensor          # the same where any of each row's top 3 counts
    chain_hist: torch.Tensor      # [R+1] anchors whose greedy chain accepts 0, 1, ... R rows

    @classmethod
    def zeros(cls, n_rows: int, device: torch.device | str = "cpu") -> "RowStats":
        zero = torch.zeros((), device=device)
        return cls(torch.zeros(n_rows, device=device), zero, zero, zero, torch.zeros(n_rows + 1, device=device))

    def __add__(self, other: "RowStats") -> "RowStats":
        return RowStats(self.hit1 + other.hit1, self.rows + other.rows, self.chain1 + other.chain1,
                        self.chain3 + other.chain3, self.chain_hist + other.chain_hist)


@dataclass
class Evaluation:
    """The held-out metrics of one evaluation (trainer.Trainer.evaluate); `to_dict` is how files record them."""
    heldout_loss: float | None    # the training loss on the held-out sequences (None: no anchor among them)
    row_top1: list[float]         # per row: the share of anchors whose top-1 is the target's argmax
    chain_tau: float              # tau if the tree were each row's argmax
    top3_tau_bound: float         # tau if each row's top 3 were all in the tree
    anchors: int
    chain_lengths: list[int]      # anchors whose greedy chain accepts 0, 1, ... R rows (tau for any smaller K)

    def to_dict(self) -> dict:
        return asdict(self)
