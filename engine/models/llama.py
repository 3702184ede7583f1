"""Llama-family decoder in plain torch: Llama 2/3, SmolLM2, Mistral, Qwen2/2.5 (qkv bias), Qwen3 (q/k norm).

Own code rather than `transformers` so attention can read and write the paged KV cache. Weights are
loaded from Hugging Face names (`load_hf_weights`) and fused on the way in: one QKV matmul and one
gate+up matmul per layer, which matters on CPU where each op has fixed overhead.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBatch, paged_attention
from engine.int4 import Int4Linear, Int4Weight
from engine.int8 import Int8Linear, Int8Source, Int8Weight

if TYPE_CHECKING:
    from engine.kv_store import LayerKV


@dataclass(frozen=True)
class ModelConfig:
    architecture: str            # "llama", "qwen2" or "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: biases on q, k, v
    qk_norm: bool = False         # Qwen3: RMSNorm on each head's q and k


class Linear(nn.Linear):
    """nn.Linear called as the quantized layers are, `(x, quantized)`, so every projection is called alike; a dense
    matrix ignores the flag."""

    def forward(self, x: torch.Tensor, quantized: bool = False) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _Fusion(threading.local):
    on = False


_FUSION = _Fusion()


@contextmanager
def fused_kernels(on: bool = True) -> Iterator[None]:
    """Within it, on CUDA, RMSNorm, RoPE and SwiGLU run as kernels torch.compile fused. For CUDA-graph captures
    only: a replay runs no Python, so a graph just has fewer kernels, each costing ~2-3 us of GPU time even
    replayed (an RMSNorm is 4 eager, RoPE 5, SwiGLU 2). In eager steps each compiled call costs more host time
    in guards than the launches it saves (1B shape on an H200: batch-1 eager decode 74 -> 26 tok/s, prefix-cached
    TTFT 13 -> 26 ms)."""
    before, _FUSION.on = _FUSION.on, on
    try:
        yield
    finally:
        _FUSION.on = before


def fused_on_cuda(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """fn as it is, or compiled by torch.compile into one kernel within `fused_kernels` on CUDA."""
    compiled = None

    def call(x: torch.Tensor, *args) -> torch.Tensor:
        nonlocal compiled
        if not (_FUSION.on and x.is_cuda):
            return fn(x, *args)
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        return compiled(x, *args)
    return call


@fused_on_cuda
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)


@fused_on_cuda
def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies, with Llama 3's wavelength-dependent scaling or linear scaling if set."""
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return (inv / scaling["factor"]).float()
    if kind == "llama3":
        factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        wavelen = 2 * math.pi / inv
        smooth = ((old_len / wavelen - low) / (high - low)).clamp(0, 1)
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        is_mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(is_mid, mid, scaled).float()
    if kind != "default":
        raise ValueError(f"unsupported rope scaling {kind!r}")
    return inv.float()


class Rotary(nn.Module):
    """Rotate-half RoPE: the cos/sin of a step's positions, looked up once a step in a table of every position the
    model has (built on first use, 4 MB for SmolLM2 in bf16), so a step never grows it: a compiled step needs none
    of its own state to change."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.max_position = cfg.max_position
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self._cos = self._sin = torch.empty(0)

    def _table(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cos.dtype != dtype or self._cos.device != self.inv_freq.device or not self._cos.numel():
            freqs = torch.outer(torch.arange(self.max_position, device=self.inv_freq.device).float(), self.inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
            self._cos, self._sin = emb.cos().to(dtype), emb.sin().to(dtype)
        return self._cos, self._sin

    def forward(self, batch: AttentionBatch, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (T, 1, head_dim) at the step's positions."""
        assert batch.num_positions <= self.max_position, "a position past the model's context"
        cos, sin = self._table(dtype)
        return cos.index_select(0, batch.positions)[:, None, :], sin.index_select(0, batch.positions)[:, None, :]


@fused_on_cuda
def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, head_dim) rotated by its positions' angles."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], batch: AttentionBatch, cache,
                quantized: bool) -> torch.Tensor:
        cfg, t = self.cfg, x.shape[0]
        qkv = self.qkv(x, quantized)
        qk = qkv[:, :self.q_size + self.kv_size].view(t, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, self.q_size + self.kv_size:].reshape(t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            qk = torch.cat([self.q_norm(qk[:, :cfg.num_heads]), self.k_norm(qk[:, cfg.num_heads:])], dim=1)
        qk = rotate(qk, *rope)  # q and k in one go: a decode step is many small ops, each with a fixed cost
        q, k = qk[:, :cfg.num_heads], qk[:, cfg.num_heads:]
        return self.o_proj(paged_attention(q, k, v, cache, batch).reshape(t, self.q_size), quantized)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, quantized: bool) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_up(x, quantized)), quantized)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, batch, cache, quantized: bool) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, batch, cache, quantized)
        return x + self.mlp(self.post_attention_layernorm(x), quantized)


class LlamaModel(nn.Module):
    """forward(token ids (T,), batch, caches, quantized) -> final hidden states (T, hidden); logits(hidden)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.packed_head: Int4Linear | Int8Linear | None = None  # the head for decode steps, where the file's allows

    def forward(self, input_ids: torch.Tensor, batch: AttentionBatch,
                caches: list[LayerKV] | None = None, quantized: bool = False) -> torch.Tensor:
        """quantized: Int4Linear / Int8Linear layers may use their low-bit kernels (steps that compute generated tokens
        only)."""
        x = self.embed_tokens(input_ids)
        return self.decoder(x, self.rotary(batch, x.dtype), batch, caches, quantized)

    def decoder(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], batch: AttentionBatch,
                caches: list[LayerKV] | None, quantized: bool) -> torch.Tensor:
        """The layers and the final norm over embedded tokens x: the part a runner may compile (no host reads)."""
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, batch, caches[i] if caches is not None else None, quantized)
        return self.norm(x)

    @property
    def head_weight(self) -> torch.Tensor:
        """(vocab, hidden): the LM head's rows, the embedding's when they are tied."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor, quantized: bool = False) -> torch.Tensor:
        """Float logits; `quantized` as in forward (packed_head: a quantized GGUF head, where it has one)."""
        if quantized and self.packed_head is not None:
            return self.packed_head(hidden, quantized=True).float()
        return F.linear(hidden, self.head_weight).float()

    @property
    def num_parameters(self) -> int:
        packed = (m.in_features * m.out_features for m in self.layers.modules()
                  if isinstance(m, (Int4Linear, Int8Linear)))
        return sum(p.numel() for p in self.parameters()) + sum(packed)

    def load_hf_weights(self, weights: dict[str, torch.Tensor | Int4Weight | list[Int4Weight] | Int8Source],
                        dtype: torch.dtype) -> None:
        """Load tensors named as in Hugging Face checkpoints (`model.layers.0.self_attn.q_proj.weight`),
        fusing q/k/v and gate/up. Int4Weight matrices become Int4Linear layers and Int8Source ones Int8Linear
        layers, computing in `dtype`; a fused matrix is int4 if all its parts are, else int8 if all are either. A
        quantized head is loaded dense and packed (packed_head) as well. Missing or unexpected tensors raise."""
        w = {k.removeprefix("model."): v for k, v in weights.items()}
        if self.lm_head is None:
            w.pop("lm_head.weight", None)
        head = "embed_tokens.weight" if self.lm_head is None else "lm_head.weight"
        w[head], self.packed_head = _head(w[head], dtype)
        for i in range(self.cfg.num_layers):
            p = f"layers.{i}."
            for kind in ("weight", "bias") if self.cfg.attention_bias else ("weight",):
                w[f"{p}self_attn.qkv.{kind}"] = _fused([w.pop(f"{p}self_attn.{n}_proj.{kind}") for n in "qkv"])
            w.pop(f"{p}self_attn.o_proj.bias", None)
            w[f"{p}mlp.gate_up.weight"] = _fused([w.pop(f"{p}mlp.gate_proj.weight"), w.pop(f"{p}mlp.up_proj.weight")])
        for name in [k for k, v in w.items() if isinstance(v, (Int4Weight, Int8Source))]:
            layer = name.removesuffix(".weight")
            if isinstance(w[name], Int8Source):
                source = w.pop(name).weight
                module = Int8Linear(Int8Weight.of(source), source, w.pop(f"{layer}.bias", None), dtype)
            elif w[name].fits_kernel:
                module = Int4Linear(w.pop(name), w.pop(f"{layer}.bias", None), dtype)
            else:
                w[name] = w[name].dequantize().to(dtype)
                continue
            self.set_submodule(layer, module)
        self.load_state_dict(w, strict=True, assign=True)


def _head(weight, dtype: torch.dtype) -> tuple[torch.Tensor, Int4Linear | Int8Linear | None]:
    """The head matrix dense in dtype, and a quantized twin for decode steps where the file's head is quantized."""
    if isinstance(weight, Int8Source):
        dense = weight.weight.to(dtype)
        return dense, Int8Linear(Int8Weight.of(weight.weight), dense, None, dtype)
    if not isinstance(weight, (Int4Weight, list)):
        return weight, None
    planes = weight if isinstance(weight, list) else [weight]
    dense = sum(p.dequantize() for p in planes).to(dtype)
    return dense, Int4Linear(planes, None, dtype, dense=dense) if planes[0].fits_kernel else None


def _fused(parts: list) -> torch.Tensor | Int4Weight | Int8Source:
    """Parts stacked along the output dimension: int4 if all are, int8 if all are int4 or int8 (a Q6_K v beside
    Q4_K q and k), else dense like the dense ones."""
    if all(isinstance(p, Int4Weight) for p in parts):
        return Int4Weight.cat(parts)
    if all(isinstance(p, (Int4Weight, Int8Source)) for p in parts):
        return Int8Source(torch.cat([p.weight if isinstance(p, Int8Source) else p.dequantize() for p in parts]))
    like = next(p for p in parts if isinstance(p, torch.Tensor))
    return torch.cat([p.dequantize().to(like) if isinstance(p, Int4Weight) else p.weight.to(like)
                      if isinstance(p, Int8Source) else p for p in parts])
