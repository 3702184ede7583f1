"""Paged attention as Triton kernels that read K/V through the block table, with no gather into a padded copy.

Used on CUDA only: attention imports this module there alone, so CPU runs never load Triton. Decode: one program
per (sequence, KV head) computes all of that head's query heads (GQA) at once, so each K/V tile is read once per
group; its shapes depend on the batch size alone, which is what lets a decode step be captured as a CUDA graph
(engine/cuda_graphs.py). Prefill: one program per (sequence, query head, tile of BLOCK_M queries), causal. Both
walk the keys in tiles of KEYS_PER_TILE, online softmax in float32 (FlashAttention's recurrence).

Chosen for both phases by bench/paged_attention.py on an H200 (Llama-3.2-1B's 32/8 heads of 64, bf16, 16-token
blocks in random order; one layer, the cache write included; ms, do_bench medians; 2026-11-30):

    phase    case                                  SDPA over gathered   flex_attention   these kernels
    decode   1 sequence, 1k context                       0.185              0.389            0.037
    decode   1 sequence, 8k context                       0.195              0.362            0.210
    decode   64 sequences, 100-1024                       0.276              0.347            0.059
    decode   256 sequences, 100-1024                      0.956              0.933            0.108
    prefill  1 prompt of 2048                             0.184              0.168            0.135
    prefill  4 chunks of 512 after 1k cached              0.168              0.150            0.143
    prefill  32 new after a 2k cached prefix              0.083              0.166            0.081

They lose one case, a single long sequence's decode (7% behind SDPA): its 8 programs, one per KV head, leave
most of the 132 multiprocessors idle; splitting the keys across programs (flash-decoding) would fill them. Besides,
the gathered paths need padded index tensors built on the host each step: 2-43 ms for these cases against
0.1-2.6 ms for the block tables these kernels read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

KEYS_PER_TILE = 64  # keys per loop step: 4 blocks of 16; at D=64, a (64, 64) bf16 tile is 8 KB
BLOCK_M = 64        # prefill queries per program


@triton.jit
def _attend(q, q_pos, end, kv_ptr, tables_ptr, seq, kvh, scale, block_size, stride_kind, stride_slot, stride_kvh,
            stride_table, M: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr):
    """softmax(q K^T) V for q (M, D) over sequence seq's keys [0, end) of KV head kvh, each row seeing the keys up
    to its position q_pos (M,): FlashAttention's online softmax, in float32. Returns (M, D) float32."""
    d, n = tl.arange(0, D), tl.arange(0, TILE)
    m = tl.full((M,), float("-inf"), tl.float32)
    total = tl.zeros((M,), tl.float32)
    acc = tl.zeros((M, D), tl.float32)
    for start in range(0, end, TILE):
        pos = start + n
        valid = pos < end
        block = tl.load(tables_ptr + seq * stride_table + pos // block_size, mask=valid, other=0)
        at = (block * block_size + pos % block_size)[:, None] * stride_slot + kvh * stride_kvh + d[None, :]
        k = tl.load(kv_ptr + at, mask=valid[:, None], other=0.0)
        v = tl.load(kv_ptr + stride_kind + at, mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    return acc / total[:, None]


@triton.jit
def _decode_kernel(q_ptr, kv_ptr, out_ptr, tables_ptr, lens_ptr, scale, block_size,
                   stride_qt, stride_qh, stride_kind, stride_slot, stride_kvh, stride_table, stride_ot, stride_oh,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr):
    seq, kvh = tl.program_id(0), tl.program_id(1)
    length = tl.load(lens_ptr + seq)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
    heads, in_group = kvh * GROUP + g, (g < GROUP)[:, None]
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=in_group, other=0.0)
    q_pos = tl.zeros((GROUP_PAD,), tl.int32) + (length - 1)  # every row is the sequence's one new token
    out = _attend(q, q_pos, length, kv_ptr, tables_ptr, seq, kvh, scale, block_size, stride_kind, stride_slot,
                  stride_kvh, stride_table, GROUP_PAD, D, TILE)
    tl.store(out_ptr + seq * stride_ot + heads[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=in_group)


@triton.jit
def _prefill_kernel(q_ptr, kv_ptr, out_ptr, tables_ptr, q_starts_ptr, q_lens_ptr, ctx_ptr, scale, block_size,
                    stride_qt, stride_qh, stride_kind, stride_slot, stride_kvh, stride_table, stride_ot, stride_oh,
                    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, TILE: tl.constexpr):
    seq, head, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_len = tl.load(q_lens_ptr + seq)
    if tile * BLOCK_M < q_len:
        q_start, ctx = tl.load(q_starts_ptr + seq), tl.load(ctx_ptr + seq)
        rows, d = tile * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, D)
        row_ok = (rows < q_len)[:, None]
        q = tl.load(q_ptr + (q_start + rows)[:, None] * stride_qt + head * stride_qh + d[None, :], mask=row_ok,
                    other=0.0)
        end = ctx + tl.minimum((tile + 1) * BLOCK_M, q_len)  # keys up to the tile's last query
        out = _attend(q, ctx + rows, end, kv_ptr, tables_ptr, seq, head // GROUP, scale, block_size, stride_kind,
                      stride_slot, stride_kvh, stride_table, BLOCK_M, D, TILE)
        tl.store(out_ptr + (q_start + rows)[:, None] * stride_ot + head * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok)


def paged_decode(q: torch.Tensor, kv: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
                 block_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, H, D): one query per sequence; kv (2, slots, KVH, D): a layer's cache; tables (B, W) int32 block ids;
    lens (B,) int32 keys each sequence sees (its position + 1). Returns (B, H, D)."""
    b, h, d = q.shape
    kvh = kv.shape[2]
    out = torch.empty_like(q) if out is None else out
    group = h // kvh
    _decode_kernel[(b, kvh)](
        q, kv, out, tables, lens, d ** -0.5, block_size,
        q.stride(0), q.stride(1), kv.stride(0), kv.stride(1), kv.stride(2), tables.stride(0), out.stride(0),
        out.stride(1), GROUP=group, GROUP_PAD=max(16, 1 << (group - 1).bit_length()), D=d, TILE=KEYS_PER_TILE)
    return out


def paged_prefill(q: torch.Tensor, kv: torch.Tensor, tables: torch.Tensor, q_starts: torch.Tensor,
                  q_lens: torch.Tensor, ctx: torch.Tensor, max_q_len: int, block_size: int) -> torch.Tensor:
    """q (T, H, D): the step's flat queries; sequence i owns rows [q_starts[i], + q_lens[i]) at positions
    [ctx[i], ctx[i] + q_lens[i]) and sees keys [0, its position] through tables[i]; their K/V are in the cache
    already. Returns (T, H, D); rows of no sequence are left unwritten."""
    t, h, d = q.shape
    out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    grid = (tables.shape[0], h, -(-max_q_len // BLOCK_M))
    _prefill_kernel[grid](
        q, kv, out, tables, q_starts, q_lens, ctx, d ** -0.5, block_size,
        q.stride(0), q.stride(1), kv.stride(0), kv.stride(1), kv.stride(2), tables.stride(0), out.stride(0),
        out.stride(1), GROUP=h // kv.shape[2], D=d, BLOCK_M=BLOCK_M, TILE=KEYS_PER_TILE)
    return out
