"""The tensors behind the paged KV cache: K and V of every token slot, in the compute dtype or as int8.

int8 stores each run of 32 values (half or a quarter of a head) as int8 with one float16 scale, llama.cpp's Q8_0
block (its `-ctk q8_0`): 34 bytes where bfloat16 takes 64, so nearly twice the tokens fit in the same memory
(heads of other sizes get one scale per head). New K/V are quantized as they are written; attention reads them
back dequantized to the compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.llama import ModelConfig

GROUP = 32  # values per int8 scale, where the head size allows
_QMAX = 127


def group_size(head_dim: int) -> int:
    return GROUP if head_dim % GROUP == 0 else head_dim


@dataclass
class LayerKV:
    """One layer's K and V, `kv` (2, slots, kv_heads, head_dim); with `scale` (2, slots, kv_heads, head_dim / group)
    float16, `kv` is int8."""
    kv: torch.Tensor
    scale: torch.Tensor | None = None

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (T, kv_heads, head_dim) at slots (T,)."""
        if self.scale is None and k.dtype != torch.float16:  # two copies, no stacked temporary (one kernel less)
            self.kv[0].index_copy_(0, slots, k)
            self.kv[1].index_copy_(0, slots, v)
            return
        kv = torch.stack([k, v])
        if kv.dtype == torch.float16:  # the one compute dtype whose range a model's activations pass: an inf or NaN
            # kept here reached other requests, through the padded and stale slots their attention masks, as 0 * inf
            torch.nan_to_num_(kv, nan=0.0, posinf=0.0, neginf=0.0)
        if self.scale is None:
            self.kv.index_copy_(1, slots, kv)
            return
        q, scale = quantize(kv)
        self.kv.index_copy_(1, slots, q)
        self.scale.index_copy_(1, slots, scale)

    def read(self, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V (len(slots), kv_heads, head_dim) at slots, in dtype."""
        kv = self.kv.index_select(1, slots)
        if self.scale is not None:
            kv = dequantize(kv, self.scale.index_select(1, slots), dtype)
        return kv[0], kv[1]


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., D) as int8 (..., D) and a float16 scale per group of values (..., D / group): x ~= q * scale."""
    groups = x.float().unflatten(-1, (-1, group_size(x.shape[-1])))
    scale = (groups.abs().amax(dim=-1) / _QMAX).to(torch.float16)  # rounded first, so q * scale is what is stored
    q = (groups / scale.float().clamp(min=torch.finfo(torch.float16).tiny)[..., None]).round_().clamp_(-_QMAX, _QMAX)
    return q.to(torch.int8).flatten(-2), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.unflatten(-1, (scale.shape[-1], -1)).to(dtype) * scale.to(dtype)[..., None]).flatten(-2)


def allocate(cfg: ModelConfig, slots: int, dtype: torch.dtype, quantized: bool,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The whole cache, (layers, 2, slots, kv_heads, head_dim) in dtype or int8, and the int8 scales or None."""
    shape = (cfg.num_layers, 2, slots, cfg.num_kv_heads, cfg.head_dim)
    if not quantized:
        return torch.zeros(shape, dtype=dtype, device=device), None
    scales = torch.zeros(*shape[:-1], cfg.head_dim // group_size(cfg.head_dim), dtype=torch.float16, device=device)
    return torch.zeros(shape, dtype=torch.int8, device=device), scales


def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype, quantized: bool) -> int:
    """KV bytes one token takes over all layers."""
    d = cfg.head_dim
    per_head = d + d // group_size(d) * 2 if quantized else d * torch.finfo(dtype).bits // 8
    return 2 * cfg.num_layers * cfg.num_kv_heads * per_head
