"""The DART draft head: one decoder layer that reads target features and predicts K+1 future tokens at once.

Draft position i holds (f_i, e(x_{i+1})): the target's tapped features of token i and the embedding of the next
token (the target's own embedding table, not stored here). K learned mask vectors are appended after the last real
position; one causal forward gives K+1 output rows: row 0 (the last real position) and the K mask slots. Row r is
the draft distribution of the token r+1 levels below the tree root.

The output layer is either the head's own Linear or tied to the target's output embedding; either way it may cover
a reduced draft vocabulary, mapped back to target ids by `d2t`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .errors import DartError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "dart-lab-draft-head/1"


class DraftHeadError(DartError):
    """A draft head file is missing, corrupt, or does not fit the target; the message names the problem."""


@dataclass
class DraftConfig:
    hidden_size: int
    vocab_size: int               # target vocabulary
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    n_mask: int = 4               # K mask slots -> K+1 logit rows
    draft_vocab_size: int | None = None  # None: the full target vocabulary
    tie_output: bool = True       # reuse the target's output embedding instead of an own lm_head
    standardize_features: bool = False  # per-dimension (x - mean) / std on the tapped features
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    double_norm: bool = False     # the authors' heads apply the final norm twice (trained so: see head_formats)
    target_name: str = ""         # which target the head was trained for (checked when both sides know)
    target_layers: int = 0
    extra: dict = field(default_factory=dict)  # provenance (training command, tokens seen, metrics)

    @property
    def n_rows(self) -> int:
        return self.n_mask + 1

    @property
    def out_vocab(self) -> int:
        return self.draft_vocab_size or self.vocab_size

    @classmethod
    def for_target(cls, target_config, **overrides) -> "DraftConfig":
        """Dimensions taken from a transformers config of the target."""
        heads = int(target_config.num_attention_heads)
        base = dict(
            hidden_size=int(target_config.hidden_size), vocab_size=int(target_config.vocab_size),
            num_heads=heads, num_kv_heads=int(getattr(target_config, "num_key_value_heads", heads) or heads),
            head_dim=int(getattr(target_config, "head_dim", None) or target_config.hidden_size // heads),
            intermediate_size=int(target_config.intermediate_size),
            rope_theta=float(_rope_theta(target_config)), rms_eps=float(getattr(target_config, "rms_norm_eps", 1e-5)),
            target_name=Path(str(getattr(target_config, "_name_or_path", "") or "")).name,
            target_layers=int(target_config.num_hidden_layers))
        base.update(overrides)
        return cls(**base)

    def validate(self) -> "DraftConfig":
        if self.n_mask < 0:
            raise DraftHeadError(f"n_mask must be >= 0, got {self.n_mask}")
        if self.num_heads % self.num_kv_heads:
            raise DraftHeadError("num_heads must be a multiple of num_kv_heads")
        if self.draft_vocab_size is not None and not 0 < self.draft_vocab_size <= self.vocab_size:
            raise DraftHeadError(f"draft_vocab_size must be in 1..{self.vocab_size}")
        return self

    def to_dict(self) -> dict:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "DraftConfig":
        names = {f.name for f in fields(cls)}
        required = ["hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"]
        missing = [k for k in required if k not in data]
        if missing:
            raise DraftHeadError(f"draft head config lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names}).validate()


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        params = getattr(config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10000.0) if isinstance(params, dict) else 10000.0
    return float(theta)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, head_dim] in fp32 of the rotary embedding at `positions` [T]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None]          # [T, head_dim/2]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (Llama's rotate-half form). x: [..., heads, T, head_dim], positions: [T] (shared by every
    leading index), or [B, T] for x [B, heads, T, head_dim] (each sequence its own)."""
    hd = x.shape[-1]
    cos, sin = (t.to(x.dtype) for t in rope_tables(positions.reshape(-1), hd, theta))
    if positions.dim() == 2:
        cos, sin = (t.view(positions.shape[0], 1, positions.shape[1], hd) for t in (cos, sin))
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftCache:
    """Keys and values of the real (non-mask) draft positions: [kv_heads, P, head_dim] each."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=1)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=1)


class DraftHead(nn.Module):
    def __init__(self, config: DraftConfig):
        super().__init__()
        c = config.validate()
        self.config = c
        H, hd = c.hidden_size, c.head_dim
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.embed_norm = RMSNorm(H, c.rms_eps)
        self.feature_norm = RMSNorm(H, c.rms_eps)
        self.mask_embed = nn.Parameter(torch.randn(2 * H) * 0.02)
        self.q_proj = nn.Linear(2 * H, c.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, c.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, c.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.num_heads * hd, H, bias=False)
        self.post_attn_norm = RMSNorm(H, c.rms_eps)
        self.gate_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, H, bias=False)
        self.final_norm = RMSNorm(H, c.rms_eps)
        self.lm_head = None if c.tie_output else nn.Linear(H, c.out_vocab, bias=False)
        if c.draft_vocab_size is not None:
            self.register_buffer("d2t", torch.arange(c.draft_vocab_size, dtype=torch.long))
        else:
            self.d2t = None
        if c.standardize_features:
            self.register_buffer("feature_mean", torch.zeros(3 * H))
            self.register_buffer("feature_std", torch.ones(3 * H))

    # ------------------------------------------------------------------ construction
    @classmethod
    def random(cls, config: DraftConfig, seed: int = 0) -> "DraftHead":
        """An untrained head with seeded weights, for tests and teaching."""
        gen = torch.Generator().manual_seed(seed)
        head = cls(config)
        with torch.no_grad():
            for name, p in head.named_parameters():
                if name.endswith("norm.weight"):
                    continue
                fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
        return head.eval()

    # ------------------------------------------------------------------ forward
    def _input(self, features: torch.Tensor, embeds: torch.Tensor):
        if self.config.standardize_features:
            features = (features - self.feature_mean.to(features.dtype)) / self.feature_std.to(features.dtype)
        g = self.fc(features.to(self.mask_embed.dtype))   # (fc may be an int8 module: no .weight)
        x = torch.cat([self.embed_norm(embeds.to(g.dtype)), self.feature_norm(g)], dim=-1)
        return x, g

    def _attend(self, x, residual, positions, mask, past_k=None, past_v=None):
        """Attention with its residual. x: [T, 2H], residual: [T, H], positions: [T], mask: [T, P+T] bool.
        Returns (h [T, H], the new keys, the new values)."""
        c = self.config
        T = x.shape[0]
        q = self.q_proj(x).view(T, c.num_heads, c.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(T, c.num_kv_heads, c.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(T, c.num_kv_heads, c.head_dim).transpose(0, 1)
        q, k = rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta)
        all_k = k if past_k is None else torch.cat([past_k, k], dim=1)
        all_v = v if past_v is None else torch.cat([past_v, v], dim=1)
        rep = c.num_heads // c.num_kv_heads
        attn = F.scaled_dot_product_attention(q, all_k.repeat_interleave(rep, 0), all_v.repeat_interleave(rep, 0),
                                              attn_mask=mask)
        h = residual + self.o_proj(attn.transpose(0, 1).reshape(T, -1))
        return h, k, v

    def _mlp_and_logits(self, h: torch.Tensor, out_weight: torch.Tensor | None, output=None) -> torch.Tensor:
        y = self.post_attn_norm(h)
        h = h + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        out = self.final_norm(h)
        if self.config.double_norm:
            out = self.final_norm(out)
        if output is not None:
            return output(out)
        if self.lm_head is not None:
            return self.lm_head(out)
        if out_weight is None:
            raise DraftHeadError("this head ties its output to the target: pass the target's output weight")
        return out @ out_weight.to(out.dtype).T

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, cache: DraftCache,
                out_weight: torch.Tensor | None = None, output=None) -> torch.Tensor:
        """One drafting step.

        features: [S, 3H] target features of the S newly committed tokens.
        embeds:   [S, H] embeddings of the tokens that follow them (the last is the pending root).
        output:   optional stand-in for the output layer (the same weights computed faster, for inference).
        Appends the S real positions to `cache` and returns logits [K+1, Vd].
        """
        c = self.config
        S, K, P = features.shape[0], c.n_mask, cache.length
        x, g = self._input(features, embeds)
        x = torch.cat([x, self.mask_embed.to(x.dtype).expand(K, -1)], dim=0)
        residual = torch.cat([g, self.mask_embed[: c.hidden_size].to(g.dtype).expand(K, -1)], dim=0)
        positions = torch.arange(P, P + S + K, device=x.device)
        mask = torch.ones(S + K, P + S + K, dtype=torch.bool, device=x.device).tril(P)
        h, k, v = self._attend(x, residual, positions, mask, cache.keys, cache.values)
        cache.append(k[:, :S], v[:, :S])  # mask slots are never cached
        return self._mlp_and_logits(h[-(K + 1):], out_weight, output)

    def forward_train(self, features: torch.Tensor, embeds: torch.Tensor, anchors: torch.Tensor,
                      out_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Many anchors of one sequence in one forward (training).

        features: [T, 3H], embeds: [T, H] (position i: features of token i, embedding of token i+1).
        anchors:  [A] positions p; each gets its own K mask slots that see positions <= p and the earlier
                  slots of their own block, exactly what inference sees after committing token p+1.
        Returns logits [A, K+1, Vd]; row r of anchor p predicts token p+2+r.
        """
        c = self.config
        T, K, A = features.shape[0], c.n_mask, anchors.shape[0]
        dev = features.device
        x, g = self._input(features, embeds)
        x = torch.cat([x, self.mask_embed.to(x.dtype).expand(A * K, -1)], dim=0)
        residual = torch.cat([g, self.mask_embed[: c.hidden_size].to(g.dtype).expand(A * K, -1)], dim=0)
        slot = torch.arange(K, device=dev)
        mask_pos = (anchors[:, None] + 1 + slot[None]).reshape(-1)            # [A*K]
        positions = torch.cat([torch.arange(T, device=dev), mask_pos])
        n = T + A * K
        mask = torch.zeros(n, n, dtype=torch.bool, device=dev)
        mask[:T, :T] = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        block_anchor = anchors.repeat_interleave(K)                            # [A*K]
        mask[T:, :T] = torch.arange(T, device=dev)[None] <= block_anchor[:, None]
        block_id = torch.arange(A, device=dev).repeat_interleave(K)
        slot_id = slot.repeat(A)
        mask[T:, T:] = (block_id[:, None] == block_id[None]) & (slot_id[None] <= slot_id[:, None])
        h, _, _ = self._attend(x, residual, positions, mask)
        rows = torch.cat([h[anchors][:, None], h[T:].view(A, K, -1)], dim=1)  # [A, K+1, H]
        return self._mlp_and_logits(rows, out_weight)

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.d2t is None else self.d2t[draft_ids]

    def tied_output(self, target_weight: torch.Tensor) -> torch.Tensor | None:
        """The weight a tied head's logits come from (`out_weight` of forward): the target's output rows of its draft
        vocabulary, all of them without one; None for a head with its own output layer."""
        if self.lm_head is not None:
            return None
        return target_weight if self.d2t is None else target_weight[self.d2t.to(target_weight.device)]

    # ------------------------------------------------------------------ compatibility and persistence
    def check_target(self, target) -> None:
        """Raise DraftHeadError unless this head fits `target` (a TargetModel)."""
        c = self.config
        if c.hidden_size != target.hidden_size:
            raise DraftHeadError(f"draft head is for hidden size {c.hidden_size}, the target has {target.hidden_size}")
        if c.vocab_size != target.vocab_size:
            raise DraftHeadError(f"draft head is for a vocabulary of {c.vocab_size}, the target has {target.vocab_size}")
        if c.target_layers and c.target_layers != target.num_layers:
            raise DraftHeadError(f"draft head was trained on a {c.target_layers}-layer target, "
                                 f"this one has {target.num_layers} layers")
        name = Path(str(getattr(target.config, "_name_or_path", "") or "")).name
        if c.target_name and name and c.target_name != name:
            raise DraftHeadError(f"draft head was trained for {c.target_name!r}, the target is {name!r}")

    def save(self, directory, dtype: torch.dtype | None = None) -> None:
        """Write config.json and model.safetensors; `dtype` (e.g. bf16, to halve the file) casts float weights."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().cpu()
                 for k, v in self.state_dict().items()}
        save_file(state, str(out / WEIGHTS_FILE))
        (out / CONFIG_FILE).write_text(json.dumps(self.config.to_dict(), indent=2))

    @classmethod
    def load(cls, directory, device="cpu", dtype=torch.float32) -> "DraftHead":
        d = Path(directory)
        config = DraftConfig.from_dict(read_config(d))
        return cls.from_state(config, read_weights(d), d / WEIGHTS_FILE).to(device=device, dtype=dtype)

    @classmethod
    def from_state(cls, config: DraftConfig, state: dict, where, file_key=lambda key: key) -> "DraftHead":
        """A head with `config` and the weights of `state` (our key names), every key and shape checked;
        `file_key` names a key as the file spells it, for the messages."""
        head = cls(config)
        expected = head.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing:
            raise DraftHeadError(f"{where} lacks weight {file_key(missing[0])!r}" +
                                 (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        if unexpected:
            raise DraftHeadError(f"{where} has unexpected weight {file_key(unexpected[0])!r} for this config")
        for key, tensor in expected.items():
            if tuple(state[key].shape) != tuple(tensor.shape):
                raise DraftHeadError(f"weight {file_key(key)!r} has shape {tuple(state[key].shape)}, "
                                     f"the config needs {tuple(tensor.shape)}")
        head.load_state_dict(state, strict=True)
        return head.eval()


def read_config(directory) -> dict:
    """A head folder's config.json as a dict, in either format (ours or the DART authors')."""
    d = Path(directory)
    if not (d / CONFIG_FILE).is_file():
        raise DraftHeadError(f"no {CONFIG_FILE} in {d}: not a draft head folder")
    try:
        data = json.loads((d / CONFIG_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise DraftHeadError(f"{d / CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DraftHeadError(f"{d / CONFIG_FILE} is not a JSON object")
    return data


def read_weights(directory) -> dict[str, torch.Tensor]:
    """A head folder's model.safetensors, as the file names its tensors."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise DraftHeadError(f"no {WEIGHTS_FILE} in {Path(directory)}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise DraftHeadError(f"{path} is corrupt or truncated: {exc}") from None
