"""4-bit GGUF weights kept 4-bit on CPU, multiplied by torch's int4 kernel (`_weight_int4pack_mm_for_cpu`).

A decode step on CPU is bound by the bytes of weights it reads. Dequantizing Q4 tensors to bfloat16 reads 16 bits
per weight where llama.cpp reads ~4.5. Q4_0, Q4_1 and Q4_K all store groups of 32 weights as `scale * q + min`
with q in 0..15, which is the form torch's kernel takes: q as packed nibbles, and per group `scale` and
`zero = min + 8 * scale`, because the kernel computes `(q - 8) * scale + zero`. So the conversion loses
nothing except rounding scale and zero to the compute dtype, which the kernel requires (a bfloat16 copy of the
dequantized weights rounds every weight instead). Other types (Q5/Q6/Q8, float) and the embedding and output
matrices are dequantized as before; on CUDA everything is.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

GROUP = 32  # weights per (scale, min) in Q4_0, Q4_1 and Q4_K sub-blocks: the kernel's group size
INT4_MAX_ROWS = 8  # rows of a matmul up to which the int4 kernel beats a dense one (Int4Linear)


@dataclass
class Int4Weight:
    """A (N, K) weight as q (N, K) uint8 in 0..15 and per-group scale and min (N, K/32) float32."""

    q: torch.Tensor
    scale: torch.Tensor
    min: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def fits_kernel(self) -> bool:
        """The kernel packs output rows by 16 (K is a whole number of groups by construction)."""
        return self.shape[0] % 16 == 0

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        groups = self.q.view(n, k // GROUP, GROUP).float() * self.scale[..., None] + self.min[..., None]
        return groups.view(n, k)

    def rows(self, order: np.ndarray) -> "Int4Weight":
        """The same weight with its output rows reordered (llama.cpp's q/k interleave undone)."""
        index = torch.from_numpy(order)
        return Int4Weight(self.q[index], self.scale[index], self.min[index])

    @staticmethod
    def cat(parts: list["Int4Weight"]) -> "Int4Weight":
        """Stacked along the output dimension, as fused q/k/v and gate/up are."""
        return Int4Weight(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "scale", "min")))


def int4_from_gguf(tensor) -> Int4Weight | None:
    """The Int4Weight of a Q4_0, Q4_1 or Q4_K GGUF tensor read by gguf.GGUFReader; None for other types."""
    kind = tensor.tensor_type.name
    if kind not in _SPLIT or len(tensor.shape) != 2:
        return None
    k, n = (int(d) for d in tensor.shape)  # GGUF lists dims innermost first
    block_bytes = _BLOCKS[kind]
    blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(-1, block_bytes)
    q, scale, low = _SPLIT[kind](blocks)
    return Int4Weight(torch.from_numpy(q.reshape(n, k)), torch.from_numpy(scale.reshape(n, k // GROUP)),
                      torch.from_numpy(low.reshape(n, k // GROUP)))


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(blocks, 16) bytes -> (blocks, 32) values: low nibbles are weights 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(blocks: np.ndarray):
    d = _f16(blocks, 0)  # w = d * (q - 8)
    return _nibbles(blocks[:, 2:]), d, -8 * d


def _q4_1(blocks: np.ndarray):
    return _nibbles(blocks[:, 4:]), _f16(blocks, 0), _f16(blocks, 2)  # w = d * q + m


def _q4_k(blocks: np.ndarray):
    """256 weights: d, dmin, 8 six-bit (scale, min) pairs packed in 12 bytes, then 4 x 32 bytes holding
    sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles). w = d * sc * q - dmin * m."""
    d, dmin, packed = _f16(blocks, 0), _f16(blocks, 2), blocks[:, 4:16].astype(np.int32)
    sc = np.concatenate([packed[:, 0:4] & 63, (packed[:, 8:12] & 15) | ((packed[:, 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([packed[:, 4:8] & 63, (packed[:, 8:12] >> 4) | ((packed[:, 4:8] >> 6) << 4)], axis=-1)
    qs = blocks[:, 16:].reshape(-1, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 256)  # chunk c: sub-blocks 2c, 2c + 1
    return q, (d * sc).astype(np.float32), (-dmin * mn).astype(np.float32)


def int8_planes_from_gguf(tensor) -> list[Int4Weight] | None:
    """A Q8_0 GGUF tensor as two 4-bit planes whose sum it is, exactly: with u = q + 128 = 16 * hi + lo,
    w = d * q = (16d * hi - 128d) + d * lo. The int4 kernel runs both (1.25 bytes a weight instead of bf16's 2:
    SmolLM2's tied 49,152 x 576 head 6.2 -> 3.1 ms on one core, logits within 0.6% where bf16's are within
    0.4%); None for other types."""
    if tensor.tensor_type.name != "Q8_0" or len(tensor.shape) != 2:
        return None
    k, n = (int(d) for d in tensor.shape)
    blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(-1, 34)
    d = torch.from_numpy(_f16(blocks, 0).reshape(n, k // GROUP))
    u = torch.from_numpy((blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, k))
    return [Int4Weight(u >> 4, 16 * d, -128 * d), Int4Weight(u & 15, d, torch.zeros_like(d))]


_BLOCKS = {"Q4_0": 18, "Q4_1": 20, "Q4_K": 144}
_SPLIT = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k}


class Int4Linear(nn.Module):
    """nn.Linear's forward over an Int4Weight, or over the sum of several (planes: a Q8_0 matrix is two). The int4
    kernel wins only on few rows (2.2x at 1 row, 1.4x at 4, 0.7x at 16, 0.4x at 512 for SmolLM2's MLP on 2
    cores), so decode steps on few rows use it and the rest a dense copy in the compute dtype: memory for speed,
    about 21 bits per weight instead of 16.

    The caller says per call whether the kernel may be used (`quantized`): the runner allows it only for steps that
    compute generated tokens alone. Prompt chunks run dense even when short, so a prompt's last token gets the
    same logits whether its prefix came from the prefix cache (a 1-token chunk) or not: the int4 kernel's
    products differ from the dense ones by rounding, enough to change a greedy answer. (On a CPU with AMX the dense
    matmuls themselves round a 1-row chunk unlike a whole prompt: oneDNN runs AMX tiles for the one, AVX-512 for
    the other, 3.2x faster prefill bought with that.)"""

    def __init__(self, weight: Int4Weight | list[Int4Weight], bias: torch.Tensor | None, dtype: torch.dtype,
                 dense: torch.Tensor | None = None):
        """`dense`: the weight in `dtype` where the caller already holds it (a tied head: the embedding)."""
        super().__init__()
        planes = weight if isinstance(weight, list) else [weight]
        self.out_features, self.in_features = planes[0].shape
        # One buffer per plane, not a stacked tensor: indexing a stack costs every call a select or a slice per
        # plane (about 1,000 of a SmolLM2 decode step's 8,800 aten ops went to such bookkeeping).
        self.planes = len(planes)
        for i, p in enumerate(planes):
            self.register_buffer(f"packed{i}", torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                p.q.to(torch.int32), 1), persistent=False)
            self.register_buffer(f"scale_zero{i}", torch.stack([p.scale.t(), (p.min + 8 * p.scale).t()], dim=-1)
                                 .to(dtype).contiguous(), persistent=False)  # (K/32, N, 2): the kernel's layout
        if dense is None:
            dense = sum(p.dequantize() for p in planes).to(dtype)
        self.register_buffer("dense", dense, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def packed_tensors(self) -> list[torch.Tensor]:
        """What the int4 kernel reads: each plane's packed weights and their scales and zeros."""
        return [getattr(self, f"{name}{i}") for i in range(self.planes) for name in ("packed", "scale_zero")]

    def forward(self, x: torch.Tensor, quantized: bool = False) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if not quantized or flat.shape[0] > INT4_MAX_ROWS:
            return F.linear(x, self.dense, self.bias)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed0, GROUP, self.scale_zero0)
        for i in range(1, self.planes):
            out = out + torch.ops.aten._weight_int4pack_mm_for_cpu(flat, getattr(self, f"packed{i}"), GROUP,
                                                                   getattr(self, f"scale_zero{i}"))
        out = out.view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias
