"""5- to 8-bit GGUF matrices (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0) as per-row int8 on CPU, multiplied by torch's int8
weight-only kernel (`_weight_int8pack_mm`) in decode steps.

Their blocks (16 or 32 weights a scale) have no torch kernel, so they used to be dequantized to bfloat16: 16 bits a
weight read every step where llama.cpp reads 5.5-8.5. Requantized per output row to int8 they take 8. Measured on
Qwen2.5-Coder-1.5B Q4_K_M (its Q6_K output head and half its ffn_down), one core: head 42.4 -> 24.7 ms, an
ffn_down 2.5 -> 0.7 ms; perplexity on 512 tokens 3.0643 -> 3.0683 (+0.13%; the head alone: 3.0610).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.int4 import INT4_MAX_ROWS

INT8_TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")


@dataclass
class Int8Source:
    """A 5- to 8-bit GGUF matrix, dequantized (float32), that the model loads as an Int8Linear."""

    weight: torch.Tensor


@dataclass
class Int8Weight:
    """A (N, K) weight as q (N, K) int8 and a float32 scale per row: w ~= q * scale[:, None]."""

    q: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor) -> "Int8Weight":
        w = weight.float()
        scale = w.abs().amax(dim=1) / 127
        return cls((w / scale.clamp(min=1e-30)[:, None]).round().clamp(-127, 127).to(torch.int8), scale)

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None]


class Int8Linear(nn.Module):
    """nn.Linear's forward over an Int8Weight for decode steps on few rows (`quantized`, as Int4Linear), over a
    dense copy in the compute dtype otherwise: prompts keep the products of the file's own dequantized weights."""

    def __init__(self, weight: Int8Weight, dense: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = weight.q.shape
        self.register_buffer("q", weight.q, persistent=False)
        self.register_buffer("scale", weight.scale.to(dtype), persistent=False)
        self.register_buffer("dense", dense.to(dtype), persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor, quantized: bool = False) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if not quantized or flat.shape[0] > INT4_MAX_ROWS:
            return F.linear(x, self.dense, self.bias)
        out = torch.ops.aten._weight_int8pack_mm(flat.contiguous(), self.q, self.scale)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias
