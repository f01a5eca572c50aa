"""The DART authors' head format, from the outside: a writer of their files and their forward, written from what
their code does (fvliang/DART `llama3_dart.py`, `dart_configs.py`, `dart_model.py`, `dart_utils.py`) without any of
dart_core's code, so tests can hold ours to it.

What their code does, as modelled here:
- config: a PretrainedConfig with Llama defaults for absent fields (eps 1e-6, kv heads = heads, rope_theta 10000 via
  getattr, head_dim = hidden // heads unless the config has one); draft_length / draft_vocab_size have no default.
- weights loaded with strict=False: a file without d2t keeps the zero buffer (offsets 0); the embedding is the
  target's `model.embed_tokens.weight`, whatever the file holds.
- one call: fc, then cat(input_layernorm(emb), hidden_norm(fc)) padded with K copies of mask_rep (2H), the residual
  (fc) padded with mask_rep[:H]; positions run on from the cached length through the K slots; causal over all of
  them, slots included; every key is cached but the cache is cut back to the real positions before the next call;
  the last K+1 rows go through the MLP, `norm` in forward and `norm` again in compute_logits, then lm_head.
- features: the inputs of the decoder layers whose index is 2, N//2 or N-3, each layer once, in layer order.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_authors_head(folder, target, draft_length: int = 3, draft_vocab: int | None = None, seed: int = 0,
                       with_embedding: bool = False, scale: float = 1.0, kv_heads: int | None = None,
                       rope_theta: float = 10000.0, rms_norm_eps: float = 1e-6) -> dict:
    """A random head in their layout: a Llama config.json with draft_length / draft_vocab_size and their key names.
    The draft vocabulary is a random subset of the target's, mapped by offsets (target = draft + d2t[draft]).
    Returns {"config": ..., "state": ...} as written."""
    c = target.config
    H, V = int(c.hidden_size), int(c.vocab_size)
    heads, kv = int(c.num_attention_heads), int(kv_heads or c.num_key_value_heads)
    hd = int(getattr(c, "head_dim", None) or H // heads)
    inter = 2 * H
    Vd = draft_vocab or V
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=gen) * scale / math.sqrt(shape[-1])

    def norm_weight():
        return 1.0 + 0.1 * torch.randn(H, generator=gen)

    chosen = torch.randperm(V, generator=gen)[:Vd].sort().values
    state = {
        "fc.weight": rand(H, 3 * H),
        "midlayer.mask_rep": torch.randn(2 * H, generator=gen),
        "midlayer.hidden_norm.weight": norm_weight(),
        "midlayer.input_layernorm.weight": norm_weight(),
        "midlayer.post_attention_layernorm.weight": norm_weight(),
        "midlayer.self_attn.q_proj.weight": rand(heads * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": rand(kv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": rand(kv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": rand(H, heads * hd),
        "midlayer.mlp.gate_proj.weight": rand(inter, H),
        "midlayer.mlp.up_proj.weight": rand(inter, H),
        "midlayer.mlp.down_proj.weight": rand(H, inter),
        "norm.weight": norm_weight(),
        "lm_head.weight": rand(Vd, H) * 4.0,
        "d2t": chosen - torch.arange(Vd),
        "t2d": torch.zeros(V, dtype=torch.bool).index_fill_(0, chosen, True),
    }
    if with_embedding:  # some of their files carry it; it must not be read
        state["embed_tokens.weight"] = torch.randn(V, H, generator=gen)
    config = {
        "architectures": ["LlamaForCausalLMDart"], "model_type": "llama", "hidden_size": H, "vocab_size": V,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "intermediate_size": inter,
        "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": rms_norm_eps, "rope_theta": rope_theta,
        "rope_scaling": None, "max_position_embeddings": 2048, "draft_length": draft_length,
        "draft_vocab_size": Vd, "target_hidden_size": H, "torch_dtype": "float32",
    }
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return {"config": config, "state": state}


# the keys of their layer's state dict (LlamaForCausalLMDart), the embedding aside: it is the target's
THEIR_KEYS = frozenset({
    "fc.weight", "midlayer.mask_rep", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"})


def read_authors_head(folder) -> dict:
    """A head folder as their code reads it: config.json, and model.safetensors as float32 weights (their layer
    is cast to the target's dtype) with the integer and bool buffers as they are. {"config", "state"}."""
    from safetensors.torch import load_file

    folder = Path(folder)
    state = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(folder / "model.safetensors")).items()}
    return {"config": json.loads((folder / "config.json").read_text()), "state": state}


def _rms(x, w, eps):
    dtype = x.dtype
    x = x.float()
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def their_config(config: dict) -> dict:
    """The values their model takes from a config.json: the file's, else their config class's defaults."""
    c = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, **config}
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    return c


def their_draft(written: dict, features, embeds, past=None):
    """Their forward for one call: features [S, 3H] (target taps), embeds [S, H]; past: (keys, values) of the
    real positions before, [kv, P, hd] each. Returns (logits [K+1, Vd], target ids [Vd], the new past)."""
    c, s = their_config(written["config"]), written["state"]
    H, K, eps = c["hidden_size"], c["draft_length"], c["rms_norm_eps"]
    heads, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    S = features.shape[0]
    P = 0 if past is None else past[0].shape[1]
    g = features @ s["fc.weight"].T
    residual = torch.cat([g, s["midlayer.mask_rep"][:H].expand(K, H)])
    x = torch.cat([_rms(embeds, s["midlayer.input_layernorm.weight"], eps),
                   _rms(g, s["midlayer.hidden_norm.weight"], eps)], dim=-1)
    x = torch.cat([x, s["midlayer.mask_rep"].expand(K, 2 * H)])
    T = S + K
    q = (x @ s["midlayer.self_attn.q_proj.weight"].T).view(T, heads, hd).transpose(0, 1)
    k = (x @ s["midlayer.self_attn.k_proj.weight"].T).view(T, kv, hd).transpose(0, 1)
    v = (x @ s["midlayer.self_attn.v_proj.weight"].T).view(T, kv, hd).transpose(0, 1)
    # their rotary cache: cos / sin per position, indexed by position ids that run on past the sequence
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.einsum("i,j->ij", torch.arange(P + T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[P:P + T], emb.sin()[P:P + T]
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    new_past = (k[:, :S], v[:, :S])
    if past is not None:
        k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
    rep = heads // kv
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    # causal over [past, S real, K masks], as an additive float mask
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
    mask = torch.cat([torch.zeros(T, P), mask], dim=1)
    weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + mask, dim=-1, dtype=torch.float32)
    attn = (weights @ v).transpose(0, 1).reshape(T, heads * hd)
    h = (residual + attn @ s["midlayer.self_attn.o_proj.weight"].T)[-(K + 1):]
    y = _rms(h, s["midlayer.post_attention_layernorm.weight"], eps)
    mlp = (torch.nn.functional.silu(y @ s["midlayer.mlp.gate_proj.weight"].T) * (y @ s["midlayer.mlp.up_proj.weight"].T))
    h = h + mlp @ s["midlayer.mlp.down_proj.weight"].T
    out = _rms(h, s["norm.weight"], eps)                               # forward() returns norm(h) ...
    logits = _rms(out, s["norm.weight"], eps) @ s["lm_head.weight"].T  # ... and compute_logits norms again
    d2t = s.get("d2t", torch.zeros(c["draft_vocab_size"], dtype=torch.long))  # absent: their zero buffer
    target_ids = torch.arange(d2t.shape[0]) + d2t
    if past is not None:
        new_past = (torch.cat([past[0], new_past[0]], dim=1), torch.cat([past[1], new_past[1]], dim=1))
    return logits, target_ids, new_past


def their_tap_layers(n: int) -> list[int]:
    """The layers whose input they keep: in layer order, each once, those with index 2, n//2 or n-3. Below 7
    layers two of these coincide and their fc (3H wide) cannot take the result; refused here."""
    taps = [i for i in range(n) if i in (2, n // 2, n - 3)]
    if len(taps) != 3:
        raise ValueError(f"their code keeps {len(taps)} feature taps on a {n}-layer target, its fc needs 3")
    return taps


def their_features(target, ids: list[int]) -> torch.Tensor:
    """Their taps: the inputs of target layers 2, N//2 and N-3, concatenated in layer order; [T, 3H]."""
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    # hidden_states[i] is the input of layer i (hidden_states[0] the embeddings)
    return torch.cat([out.hidden_states[i][0] for i in their_tap_layers(len(target.layers))], dim=-1)
