"""Weights as a model dequantized from a Q4_1 file holds them: each output's run of 32 inputs quantized as llama.cpp's
Q4_1 does (d = (max - min) / 15 and m = min, both stored in fp16; q = round((w - min) / d) in 0..15) and dequantized
as gguf's reader does, in numpy: (d * q) + m, each operation rounded to fp32."""

from __future__ import annotations

import numpy as np
import torch


def q4_1_values(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] (K a multiple of 32) quantized to Q4_1 blocks and read back in fp32."""
    n, k = weight.shape
    w = weight.detach().float().numpy().reshape(n, k // 32, 32)
    lo, hi = w.min(-1, keepdims=True), w.max(-1, keepdims=True)
    step = (hi - lo) / 15
    inverse = np.divide(1.0, step, out=np.zeros_like(step), where=step > 0)
    q = np.minimum(15, ((w - lo) * inverse + 0.5).astype(np.int32)).astype(np.float32)
    d, m = step.astype(np.float16).astype(np.float32), lo.astype(np.float16).astype(np.float32)
    return torch.from_numpy(((d * q) + m).reshape(n, k).astype(np.float32))


def as_q4_1_model(target) -> None:
    """Every decoder linear of `target`'s model rounded to Q4_1 blocks in place, as the default model's are."""
    with torch.no_grad():
        for name, module in target.model.named_modules():
            if isinstance(module, torch.nn.Linear) and ".layers." in name:
                module.weight.copy_(q4_1_values(module.weight))
