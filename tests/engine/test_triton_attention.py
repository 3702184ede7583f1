"""The Triton paged-attention kernels against attention over gathered K/V. On CUDA they run in bfloat16; without
CUDA but with Triton installed they run in Triton's interpreter (float32), so the indexing is checked on a CPU too."""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
if not CUDA and importlib.util.find_spec("triton") is not None:
    # before triton is imported: its own jit'd helpers (tl.max, tl.sum) are made interpretable then, and each
    # test failed with "Cannot call @triton.jit'd outside of the scope of a kernel"
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from engine.triton_attention import paged_decode, paged_prefill  # noqa: E402

DEVICE, DTYPE, TOL = ("cuda", torch.bfloat16, 2e-2) if CUDA else ("cpu", torch.float32, 1e-4)
BLOCK = 16


def random_cache(num_blocks: int, kvh: int, d: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(2, num_blocks * BLOCK, kvh, d, generator=gen).to(DEVICE, DTYPE)


def tables_for(lengths: list[int], num_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """Each sequence's blocks drawn from a shuffled pool, so no sequence's blocks lie in order."""
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(-(-n // BLOCK) for n in lengths)
    rows = []
    for n in lengths:
        need = -(-n // BLOCK)
        rows.append(pool[:need] + [0] * (width - need))
        pool = pool[need:]
    return torch.tensor(rows, dtype=torch.int32, device=DEVICE)


def reference(q: torch.Tensor, kv: torch.Tensor, table: list[int], positions: list[int]) -> torch.Tensor:
    """q (n, H, D) at positions; keys 0 .. position, in float64."""
    keys = positions[-1] + 1
    slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(keys)], device=kv.device)
    k, v = (kv[i].index_select(0, slots).double().transpose(0, 1) for i in (0, 1))  # (KVH, keys, D)
    mask = torch.arange(keys, device=kv.device)[None, :] <= torch.tensor(positions, device=kv.device)[:, None]
    o = F.scaled_dot_product_attention(q.double().transpose(0, 1), k, v, attn_mask=mask, enable_gqa=True)
    return o.transpose(0, 1)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (32, 8, 64), (14, 2, 64)])
def test_decode_matches_attention_over_gathered_keys(heads, kv_heads, d):
    gen = torch.Generator().manual_seed(heads)
    lengths = [1, 15, 16, 17, 64, 65, 200]
    kv = random_cache(64, kv_heads, d, gen)
    tables = tables_for(lengths, 64, gen)
    q = torch.randn(len(lengths), heads, d, generator=gen).to(DEVICE, DTYPE)
    out = torch.full_like(q, float("nan"))
    paged_decode(q, kv[:, :], tables, torch.tensor(lengths, dtype=torch.int32, device=DEVICE), BLOCK, out=out)
    for i, n in enumerate(lengths):
        ref = reference(q[i:i + 1], kv, tables[i].tolist(), [n - 1])
        assert relative_error(out[i:i + 1], ref) < TOL, f"sequence {i} ({n} keys)"


def test_decode_reads_queries_from_a_strided_view():
    """The model passes q as a view of its fused q/k tensor: rows are (H + KVH) * D apart."""
    gen = torch.Generator().manual_seed(1)
    kv = random_cache(8, 2, 64, gen)
    qk = torch.randn(3, 8 + 2, 64, generator=gen).to(DEVICE, DTYPE)
    tables = tables_for([5, 30, 70], 8, gen)
    out = paged_decode(qk[:, :8], kv, tables, torch.tensor([5, 30, 70], dtype=torch.int32, device=DEVICE), BLOCK)
    for i, n in enumerate([5, 30, 70]):
        assert relative_error(out[i:i + 1], reference(qk[i:i + 1, :8], kv, tables[i].tolist(), [n - 1])) < TOL


def test_prefill_matches_causal_attention_with_cached_context():
    """Three chunks in one step: a whole prompt, a chunk after 40 cached tokens, a one-token tail after 100."""
    gen = torch.Generator().manual_seed(2)
    chunks = [(0, 70), (40, 33), (100, 1)]  # (cached positions before it, its length)
    lengths = [c + n for c, n in chunks]
    kv = random_cache(64, 3, 64, gen)
    tables = tables_for(lengths, 64, gen)
    total = sum(n for _, n in chunks) + 2
    q = torch.randn(total, 9, 64, generator=gen).to(DEVICE, DTYPE)
    starts = [2, 72, 105]  # rows 0-1 and 104 belong to no chunk
    out = paged_prefill(q, kv, tables, *(torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in
                                         (starts, [n for _, n in chunks], [c for c, _ in chunks])),
                        max_q_len=70, block_size=BLOCK)
    for i, ((ctx, n), s) in enumerate(zip(chunks, starts)):
        ref = reference(q[s:s + n], kv, tables[i].tolist(), list(range(ctx, ctx + n)))
        assert relative_error(out[s:s + n], ref) < TOL, f"chunk {i}"
