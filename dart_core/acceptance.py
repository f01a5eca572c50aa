"""Choosing tokens from target logits, and accepting a draft tree against them.

Greedy: walk down the tree while a child carries the target's argmax; the argmax at the last accepted node is the
bonus token.

Sampling: the multi-draft rule for deterministic drafts (SpecInfer / EAGLE). At a node with target distribution p,
try each child token x in turn: accept with probability p(x); on rejection set p(x) = 0 and renormalise. If every
child is rejected, or the node has none, the bonus token is drawn from what is left of p. Each emitted token is then
distributed exactly as p, so the output has the target's own (processed) distribution.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch

from .errors import ConfigError
from .machine.few_rows import ARGMAX_COLUMNS
from .machine.hardware import kernels_here
from .tree import TokenTree

GREEDY_TEMPERATURE = 1e-5   # temperatures at or below this decode greedily


def is_greedy(temperature: float) -> bool:
    return temperature <= GREEDY_TEMPERATURE


@dataclass
class SamplingConfig:
    temperature: float = 0.0   # at or below GREEDY_TEMPERATURE: greedy
    top_p: float = 1.0         # nucleus: keep the smallest set with mass >= top_p (1.0 = off)
    top_k: int = 0             # keep the k most likely tokens (0 = off)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    def text(self) -> str:
        """'greedy', or 'temperature 0.7, top-p 0.9, top-k 0, seed 3'."""
        return "greedy" if self.greedy else \
            f"temperature {self.temperature}, top-p {self.top_p}, top-k {self.top_k}, seed {self.seed}"

    def validate(self) -> "SamplingConfig":
        if not (self.temperature >= 0 and self.temperature == self.temperature):
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")
        return self

    def make_generator(self) -> torch.Generator:
        gen = torch.Generator()
        gen.manual_seed(self.seed if self.seed is not None else torch.seed())
        return gen

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SamplingConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def processed_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """[..., V] logits -> [..., V] fp32 probabilities after temperature, then top-k, then top-p (HF's order)."""
    scores = logits.float() / max(cfg.temperature, GREEDY_TEMPERATURE)
    if cfg.top_k > 0 and cfg.top_k < scores.shape[-1]:
        kth = torch.topk(scores, cfg.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop_sorted = cum <= (1 - cfg.top_p)
        drop_sorted[..., -1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(-1)


@dataclass
class Acceptance:
    path: list[int]   # accepted tree nodes from the root (node 0) down
    bonus: int        # the target's own token after the last accepted node

    @property
    def accepted(self) -> int:
        """Draft tokens accepted (the root is not a draft)."""
        return len(self.path) - 1


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """The argmax along the last dimension, the first of equal maxima as argmax picks it. On a CPU with our kernels,
    fp32 logits take our scan, each thread reading the columns its output layer wrote (inside decoding on the AMX
    Xeon, 8 rows of 49k logits: 0.09 ms against 0.22 by torch's max); elsewhere torch's max, three times faster than
    its argmax."""
    if logits.dim() and logits.numel() and logits.device.type == "cpu" and logits.dtype == torch.float32 \
            and logits.shape[-1] < ARGMAX_COLUMNS and (kernel := kernels_here()) is not None:
        return kernel.argmax(logits.reshape(-1, logits.shape[-1])).reshape(logits.shape[:-1])
    return logits.max(-1).indices


def choose_token(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None) -> int:
    """One token from a [V] logit row: argmax, or a sample from the processed distribution."""
    if cfg.greedy:
        return int(greedy_ids(logits))
    probs = processed_probs(logits, cfg).cpu()
    return int(torch.multinomial(probs, 1, generator=gen))


def accept(tree: TokenTree, logits: torch.Tensor, cfg: SamplingConfig,
           gen: torch.Generator | None = None) -> Acceptance:
    """logits: [n, V] target logits at each tree node (row i predicts the token after node i)."""
    if cfg.greedy:
        return accept_choices(tree, greedy_ids(logits).tolist())
    return _accept_sampling(tree, logits, cfg, gen, _children(tree))


def accept_choices(tree: TokenTree, argmax: list[int]) -> Acceptance:
    """Greedy acceptance from the target's choice at each tree node (TargetModel.verify with `choices`)."""
    children = _children(tree)
    path = [0]
    while True:
        want = argmax[path[-1]]
        nxt = next((c for c in children.get(path[-1], ()) if tree.tokens[c] == want), None)
        if nxt is None:
            return Acceptance(path, want)
        path.append(nxt)


def _children(tree: TokenTree) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents[1:], start=1):
        children.setdefault(p, []).append(i)
    return children


def _accept_sampling(tree: TokenTree, logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None,
                     children: dict[int, list[int]]) -> Acceptance:
    probs = processed_probs(logits, cfg)
    path = [0]
    while True:
        p = probs[path[-1]].cpu().double()
        moved = False
        for child in children.get(path[-1], ()):
            x = tree.tokens[child]
            if float(torch.rand((), generator=gen, dtype=torch.float64)) < float(p[x]):
                path.append(child)
                moved = True
                break
            p[x] = 0.0
            p = p / p.sum()
        if not moved:
            return Acceptance(path, int(torch.multinomial(p, 1, generator=gen)))
