"""Reading a draft head folder in either format: DART Lab's own, or the DART authors' (fvliang/DART).

The authors' folder holds a Llama `config.json` with the extra fields `draft_length` (K) and `draft_vocab_size`,
and `model.safetensors` with their key names (`midlayer.*`, `norm`, `lm_head`, the buffers `d2t` and `t2d`). Their
layer is ours: the same fc, the same [embedding, features] attention input, the same mask vector, the same MLP. Three
things differ, and are translated here so their weights compute what their code computes:
- the final norm is applied twice (`norm` before returning, then again in `compute_logits`): `double_norm`;
- `d2t` holds offsets (target id = draft id + d2t[draft id]); ours holds the target ids themselves;
- the embedding is the target's and is not read from the file (nor is `t2d`, unused at inference).

Writing (`save_authors`) is the same translation backwards, for heads whose forward theirs can compute exactly:
a head with the double norm (`--format authors` trains one from the start, see `authors_compatible`) and feature
standardisation by scale only (folded into fc; a mean would be a bias, which their fc has not).

Their config is a `PretrainedConfig` with Llama's defaults (`dart_configs.DartConfig`): a field that is absent takes
the default below, as it does for them; `draft_length` and `draft_vocab_size` have none and are required. Their
weights are loaded with `strict=False`, so a file without `d2t` keeps the all-zero buffer: offsets 0, the identity
map; we do the same. Any other missing weight would stay randomly initialised for them; we refuse the file instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..draft_head import (CONFIG_FILE, FORMAT, WEIGHTS_FILE, DraftConfig, DraftHead, DraftHeadError, read_config,
                         read_weights)

AUTHORS = "the DART authors' format"

# our key -> the authors' key
AUTHORS_KEYS = {
    "fc.weight": "fc.weight",
    "mask_embed": "midlayer.mask_rep",
    "embed_norm.weight": "midlayer.input_layernorm.weight",
    "feature_norm.weight": "midlayer.hidden_norm.weight",
    "q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "post_attn_norm.weight": "midlayer.post_attention_layernorm.weight",
    "gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "up_proj.weight": "midlayer.mlp.up_proj.weight",
    "down_proj.weight": "midlayer.mlp.down_proj.weight",
    "final_norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "d2t": "d2t",
}
NOT_READ = ("embed_tokens.weight", "t2d")  # in their files or not: the embedding is the target's


def head_format(folder) -> str:
    """FORMAT or AUTHORS, from the folder's config.json; a DraftHeadError naming what is missing otherwise."""
    return _format_of(read_config(head_folder(folder)), Path(folder))


def load_head(folder, device="cpu", dtype=torch.float32) -> DraftHead:
    """A head folder in either format (its config read once)."""
    d = head_folder(folder)
    data = read_config(d)
    if _format_of(data, d) == FORMAT:
        head = DraftHead.from_state(DraftConfig.from_dict(data), read_weights(d), d / WEIGHTS_FILE)
    else:
        head = _authors_head(data, d)
    return head.to(device=device, dtype=dtype)


def head_folder(folder) -> Path:
    """`folder` as a Path, where it is a folder (what a head's files must be in)."""
    d = Path(folder)
    if not d.is_dir():
        raise DraftHeadError(f"{d} is not a folder: --draft takes a head folder (or 'default', 'random')")
    return d


def _format_of(data: dict, d: Path) -> str:
    if data.get("format") == FORMAT:
        return FORMAT
    if "draft_length" in data:
        return AUTHORS
    if "format" in data:
        raise DraftHeadError(f"{d / CONFIG_FILE} is in format {data['format']!r}; this version reads {FORMAT!r} "
                             f"and {AUTHORS}")
    raise DraftHeadError(f"{d} is not a draft head folder: its {CONFIG_FILE} has neither 'format': {FORMAT!r} "
                         f"(DART Lab) nor 'draft_length' ({AUTHORS})")


# their DartConfig's defaults for the fields our head uses (rope_theta: their attention's getattr default)
AUTHORS_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                    "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
AUTHORS_REQUIRED = ("draft_length", "draft_vocab_size")   # read with no default by their model


def authors_config(data: dict, where) -> DraftConfig:
    """Our DraftConfig for the authors' config.json `data`."""
    missing = [k for k in AUTHORS_REQUIRED if data.get(k) is None]
    if missing:
        raise DraftHeadError(f"{where} lacks {', '.join(missing)} ({AUTHORS})")
    # a null counts as absent (for them a null here would fail; the default is the only sensible reading)
    data = {**AUTHORS_DEFAULTS, **{k: v for k, v in data.items() if v is not None}}
    hidden, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
    target_hidden = data.get("target_hidden_size")
    if target_hidden is not None and int(target_hidden) != hidden:
        # Their embedding (the target's, width H_target) feeds a norm of width H: the two must agree.
        raise DraftHeadError(f"{where}: target_hidden_size {target_hidden} differs from hidden_size {hidden}; "
                             "the head reads the target's embedding, so they must be equal")
    if data["hidden_act"] != "silu":
        raise DraftHeadError(f"{where}: hidden_act {data['hidden_act']!r} is not supported (only 'silu')")
    scaling = data.get("rope_scaling")
    if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
        raise DraftHeadError(f"{where}: rope_scaling {scaling.get('rope_type') or scaling.get('type')!r} is not "
                             "supported (only plain RoPE)")
    return DraftConfig(
        hidden_size=hidden, vocab_size=int(data["vocab_size"]), num_heads=heads,
        num_kv_heads=int(data.get("num_key_value_heads") or heads),
        head_dim=int(data.get("head_dim") or hidden // heads), intermediate_size=int(data["intermediate_size"]),
        n_mask=int(data["draft_length"]), draft_vocab_size=int(data["draft_vocab_size"]), tie_output=False,
        rope_theta=float(data["rope_theta"]), rms_eps=float(data["rms_norm_eps"]),
        double_norm=True, extra={"source_format": AUTHORS}).validate()


def _authors_head(data: dict, d: Path) -> DraftHead:
    """A head from the authors' config.json `data` and the weights in folder `d`, with their key names."""
    config = authors_config(data, d / CONFIG_FILE)
    weights = d / WEIGHTS_FILE
    raw = read_weights(d)
    theirs = {v: k for k, v in AUTHORS_KEYS.items()}
    state = {theirs.get(key, key): tensor for key, tensor in raw.items() if key not in NOT_READ}
    # absent: their buffer stays zeros (loaded with strict=False), i.e. draft id i is target id i
    offsets = state.get("d2t", torch.zeros(config.out_vocab, dtype=torch.long))
    state["d2t"] = _target_ids(offsets, config, weights)
    return DraftHead.from_state(config, state, weights, file_key=lambda key: AUTHORS_KEYS.get(key, key))


def _target_ids(offsets: torch.Tensor, config: DraftConfig, where) -> torch.Tensor:
    """Their offsets as our map: target id = draft id + offset, every one inside the target vocabulary."""
    if offsets.dim() != 1 or offsets.dtype.is_floating_point:
        raise DraftHeadError(f"{where}: d2t must be a 1-D integer tensor, got {tuple(offsets.shape)} {offsets.dtype}")
    ids = torch.arange(offsets.shape[0], dtype=torch.long) + offsets.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size):
        raise DraftHeadError(f"{where}: d2t maps draft ids outside the target vocabulary of {config.vocab_size}")
    return ids


# ---------------------------------------------------------------------------------------------- writing
def authors_compatible(head: DraftHead) -> str | None:
    """None if `save_authors` can write `head` so that their forward drafts exactly what ours does, else why not.

    Why a head must be trained with the double norm to be written in their format: their logits are
    lm_head(n(n(h))), ours lm_head(n(h)), n(x) = w * x / rms(x). n(n(h)) = w^2 * h / rms(w * h) (eps aside), so a
    single-norm head could be written only up to a per-row factor rms(h) / rms(w * h) that depends on h: no fixed
    choice of their weights gives our rows. (With w = 1 in their norm and ours folded into lm_head the factor is
    1 + O(eps / ms(h)): the same order of tokens, not the same probabilities.) So `--format authors` trains their
    architecture (DraftConfig.double_norm) from the first step, and this writer refuses anything else."""
    c = head.config
    if not c.double_norm:
        return ("it applies its final norm once; their code applies it twice (train it with --format authors, "
                "which trains their architecture)")
    if head.lm_head is None:
        return "its output layer is tied to the target's; theirs is the head's own lm_head"
    if c.standardize_features and bool(head.feature_mean.detach().abs().max() > 0):
        return "it subtracts a feature mean, a bias their fc does not have"
    return None


def save_authors(head: DraftHead, folder, dtype: torch.dtype | None = None, max_positions: int = 2048) -> None:
    """Write `head` in the DART authors' format: their config.json fields and key names, d2t as offsets with t2d
    beside, no embedding. Feature scales (standardisation without a mean) are folded into fc. A head their forward
    cannot compute exactly is refused (DraftHeadError, the reason from `authors_compatible`).
    max_positions: their rotary cache's first length (max_position_embeddings; it grows as needed)."""
    why = authors_compatible(head)
    if why is not None:
        raise DraftHeadError(f"cannot write this head in {AUTHORS}: {why}")
    c = head.config
    ours = {k: v.detach().float().cpu() for k, v in head.state_dict().items()}
    if c.standardize_features:  # fc(x / s) = (fc.weight / s) x
        ours["fc.weight"] = ours["fc.weight"] / ours.pop("feature_std")[None]
        ours.pop("feature_mean")
    d2t = ours.pop("d2t", None)
    target_ids = torch.arange(c.out_vocab) if d2t is None else d2t.long()
    state = {AUTHORS_KEYS[k]: (v if dtype is None else v.to(dtype)).contiguous() for k, v in ours.items()}
    state["d2t"] = (target_ids - torch.arange(c.out_vocab)).contiguous()       # target id = draft id + offset
    state["t2d"] = torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, target_ids, True)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / WEIGHTS_FILE))
    (out / CONFIG_FILE).write_text(json.dumps(authors_config_dict(c, dtype or torch.float32, max_positions), indent=2))


def authors_config_dict(c: DraftConfig, dtype: torch.dtype, max_positions: int) -> dict:
    """Their config.json for our DraftConfig: a Llama config (one layer) with draft_length and draft_vocab_size.
    rope_theta and rope_scaling are top-level keys, as in their released configs (read by their attention)."""
    return {
        "architectures": ["LlamaForCausalLMDart"], "model_type": "llama", "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size, "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim, "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
        "hidden_act": "silu", "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta, "rope_scaling": None,
        "max_position_embeddings": int(max_positions), "tie_word_embeddings": False,
        "draft_length": c.n_mask, "draft_vocab_size": c.out_vocab, "target_hidden_size": c.hidden_size,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
