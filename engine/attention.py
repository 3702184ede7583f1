"""Attention over a paged KV cache.

Every token's K/V is written to its slot (`block * block_size + offset`); queries then attend to their
sequence's keys gathered through the block table. Sequences are padded into groups so one SDPA call
serves a whole group: one group for decode tokens (one query each), one for prefill chunks. Padding
costs little because the runner keeps decodes and prefills apart, and it keeps Python out of the
per-token path. On CUDA a step may instead carry `PagedTables`, and attention then runs as Triton kernels that
read K/V through the block tables themselves (engine/triton_attention.py; the model runner decides which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from engine.kv_store import LayerKV


@dataclass
class AttentionGroup:
    """Sequences padded to a common query length Q and key length K. Index tensors are flat so every gather
    is an `index_select`: advanced indexing (`x[idx]`) is orders of magnitude slower on a busy multi-core CPU."""

    token_index: torch.Tensor  # (B*Q,) index into the step's flat tokens; padding repeats a valid one
    valid_rows: torch.Tensor   # (V,) rows of the (B*Q) padded queries that are real tokens
    valid_tokens: torch.Tensor  # (V,) the step's flat token index of each of those rows
    kv_slots: torch.Tensor | None  # (B*K,) cache slot of each key position; None for contiguous runs
    mask: torch.Tensor         # (B, 1, Q, K) bool, True where a query may see a key
    unpadded: bool = False     # token_index is 0 .. B*Q-1: the sequences' tokens as they lie, none padded

    @property
    def shape(self) -> tuple[int, int, int]:
        b, _, q, k = self.mask.shape
        return b, q, k


@dataclass
class PagedTables:
    """Where each sequence's queries and keys are, for the Triton kernels (CUDA). Sequence i owns the step's flat
    tokens [q_starts[i], + q_lens[i]) at positions [ctx[i], ctx[i] + q_lens[i]), and its keys lie in the blocks of
    tables[i]. `decode`: every q_len is 1 and the flat tokens are the sequences in order, so q_starts, q_lens and
    max_q_len go unread and `ctx + 1` is each sequence's key count (`lens`)."""

    tables: torch.Tensor    # (B, W) int32 block ids; entries past a sequence's last block are never read
    lens: torch.Tensor      # (B,) int32 keys each sequence sees at its last query: ctx + q_len
    block_size: int
    decode: bool
    q_starts: torch.Tensor | None = None  # (B,) int32
    q_lens: torch.Tensor | None = None    # (B,) int32
    ctx: torch.Tensor | None = None       # (B,) int32
    max_q_len: int = 1


@dataclass
class AttentionBatch:
    """What one forward step needs to know about where tokens live."""

    positions: torch.Tensor            # (T,) position of each flat token
    slot_mapping: torch.Tensor | None  # (T,) cache slot to write each token's K/V; None: no cache
    groups: list[AttentionGroup]
    num_positions: int                 # 1 + the largest position, known without reading `positions` back
    paged: PagedTables | None = None   # set: attention runs as Triton kernels over the cache, and groups go unread


def build_group(token_starts: list[int], starts: list[int], lengths: list[int],
                block_tables: list[list[int]] | None, block_size: int, device) -> AttentionGroup:
    """One padded group. Sequence i owns flat tokens [token_starts[i], +lengths[i]) at positions
    [starts[i], starts[i] + lengths[i]); it sees keys at positions [0, starts[i] + lengths[i])."""
    q_len, k_len = max(lengths), max(s + n for s, n in zip(starts, lengths))
    lengths_t, starts_t = torch.tensor(lengths), torch.tensor(starts)
    q_off = torch.arange(q_len)
    valid = q_off[None, :] < lengths_t[:, None]
    token_index = torch.tensor(token_starts)[:, None] + torch.where(valid, q_off, 0)
    q_pos = starts_t[:, None] + torch.where(valid, q_off, 0)
    k_pos = torch.arange(k_len)
    mask = k_pos[None, None, :] <= q_pos[:, :, None]
    kv_slots = None
    if block_tables is not None:
        width = max(len(t) for t in block_tables)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables])
        block_idx = torch.clamp(k_pos // block_size, max=width - 1)
        kv_slots = (tables[:, block_idx] * block_size + k_pos % block_size).flatten().to(device)
    flat_valid = valid.flatten()
    unpadded = all(n == q_len for n in lengths) and token_starts == list(range(0, q_len * len(lengths), q_len))
    return AttentionGroup(token_index.flatten().to(device), flat_valid.nonzero()[:, 0].to(device),
                          token_index.flatten()[flat_valid].to(device), kv_slots, mask[:, None].to(device), unpadded)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKV | None,
                    batch: AttentionBatch) -> torch.Tensor:
    """q: (T, H, D); k, v: (T, KVH, D); cache: this layer's K/V by slot, or None to attend only within this
    step's tokens. Returns (T, H, D)."""
    if cache is not None:
        cache.write(batch.slot_mapping, k, v)
    if batch.paged is not None:
        return _attend_paged(q, cache.kv, batch.paged)
    if len(batch.groups) == 1 and batch.groups[0].unpadded and math.prod(batch.groups[0].shape[:2]) == q.shape[0]:
        # every decode step (and a lone prompt chunk): the group is the step's tokens as they lie, so no gather in
        # and no scatter out (four ops a layer)
        return _attend_group(q, k, v, cache, batch.groups[0], gathered=False)
    out = torch.empty_like(q)
    for g in batch.groups:
        out.index_copy_(0, g.valid_tokens, _attend_group(q, k, v, cache, g).index_select(0, g.valid_rows))
    return out


def _attend_paged(q: torch.Tensor, kv: torch.Tensor, p: PagedTables) -> torch.Tensor:
    from engine import triton_attention  # CUDA only: a CPU run never loads Triton
    if p.decode:
        return triton_attention.paged_decode(q, kv, p.tables, p.lens, p.block_size)
    return triton_attention.paged_prefill(q, kv, p.tables, p.q_starts, p.q_lens, p.ctx, p.max_q_len, p.block_size)


def _attend_group(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKV | None, g: AttentionGroup,
                  gathered: bool = True) -> torch.Tensor:
    """The group's padded rows (B*Q, H, D); `gathered`: its queries are picked out of the step's by token_index."""
    b, q_len, k_len = g.shape
    if cache is not None:
        kg, vg = cache.read(g.kv_slots, q.dtype)
    else:
        kg, vg = k.index_select(0, g.token_index), v.index_select(0, g.token_index)
    qg = (q.index_select(0, g.token_index) if gathered else q).view(b, q_len, *q.shape[1:])
    kg, vg = kg.view(b, k_len, *kg.shape[1:]), vg.view(b, k_len, *vg.shape[1:])
    if q_len == 1 and torch.compiler.is_compiling():
        attend = _summed_attention
    else:
        attend = _grouped_attention if q_len == 1 and q.is_cpu and q.dtype != torch.float32 else _sdpa
    o = attend(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2), g.mask)
    return o.transpose(1, 2).reshape(b * q_len, *q.shape[1:])


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention as two batched matmuls, each KV head serving its group of query heads in place. For bf16
    decode steps on CPU, where SDPA's kernel is slow (8 sequences x 120 keys: 604 -> 118 us a layer for
    SmolLM2's 9/3 heads); prefill chunks stay on SDPA, which wins there. q: (B, H, Q, D), k, v: (B, KVH, K, D),
    mask: (B, 1, Q, K)."""
    (b, h, q_len, d), (kvh, k_len) = q.shape, k.shape[1:3]
    scores = torch.matmul(q.reshape(b, kvh, h // kvh * q_len, d), k.transpose(-1, -2)).float() * d ** -0.5
    scores = scores.view(b, kvh, h // kvh, q_len, k_len).masked_fill(~mask[:, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype).view(b, kvh, h // kvh * q_len, k_len)
    return torch.matmul(probs, v).view(b, h, q_len, d)


def _summed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Decode attention as broadcast products and sums, for compiled steps: inductor fuses them, the gathers of
    K/V from the cache and the softmax into a few loops, where matmuls would stay separate calls (two a layer,
    each ~30 us for SmolLM2's tiny shapes on CPU). Shapes as _grouped_attention's, q_len 1."""
    (b, h, _, d), kvh = q.shape, k.shape[1]
    qg = q.view(b, kvh, h // kvh, 1, d).float()
    scores = (qg * k[:, :, None].float()).sum(-1) * d ** -0.5  # (B, KVH, G, K)
    probs = torch.softmax(scores.masked_fill(~mask[:, :, None, 0], float("-inf")), dim=-1)
    out = (probs[..., None] * v[:, :, None].float()).sum(-2)  # (B, KVH, G, D)
    return out.to(q.dtype).view(b, h, 1, d)
