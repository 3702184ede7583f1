"""Paged attention on the GPU, three ways, decode and prefill apart: which kernel the engine uses where.

    python bench/paged_attention.py [--device cuda]   (--device cpu --quick: checks the script, Triton interpreted)

Llama-3.2-1B's attention (32 query heads, 8 KV heads, head size 64, bf16), K/V in a paged cache of 16-token blocks
handed out in random order, as a busy engine's are. One layer's attention per call, the cache write included:
- sdpa: the engine's CPU path on the GPU: K/V gathered through the block table into padded groups, then
  `scaled_dot_product_attention` with a boolean mask (engine/attention.py);
- flex: the same gathered K/V through `torch.nn.attention.flex_attention` (compiled) with a block mask built from
  the sequences' lengths;
- triton: engine/triton_attention.py, reading K/V through the block table with no gather.
Each is checked against float64 attention first (relative error printed); times are do_bench medians. The host
work of building a step's index tensors (once per step, not per layer) is timed apart, for sdpa/flex and triton.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from engine.attention import AttentionBatch, PagedTables, build_group, paged_attention  # noqa: E402
from engine.kv_store import LayerKV  # noqa: E402

H, KVH, D, BLOCK = 32, 8, 64, 16
CASES = [  # (phase, [(cached positions, new tokens) per sequence], label)
    ("decode", [(1023, 1)], "1 seq, 1k context"),
    ("decode", [(8191, 1)], "1 seq, 8k context"),
    ("decode", "random64", "64 seqs, 100-1024"),
    ("decode", "random256", "256 seqs, 100-1024"),
    ("prefill", [(0, 2048)], "1 prompt of 2048"),
    ("prefill", [(1024, 512)] * 4, "4 chunks of 512 after 1k cached"),
    ("prefill", [(2048, 32)], "32 new after a 2k cached prefix"),
]


def shapes(spec, rng: random.Random) -> list[tuple[int, int]]:
    if isinstance(spec, str):
        return [(rng.randint(100, 1024) - 1, 1) for _ in range(int(spec.removeprefix("random")))]
    return spec


def layout(seqs: list[tuple[int, int]], rng: random.Random, device: str):
    """Block tables from a shuffled pool, and every index the three paths need."""
    need = [-(-(c + n) // BLOCK) for c, n in seqs]
    pool = list(range(sum(need) + 1))
    rng.shuffle(pool)
    tables, at = [], 0
    for k in need:
        tables.append(pool[at:at + k])
        at += k
    slots = [t[p // BLOCK] * BLOCK + p % BLOCK for t, (c, n) in zip(tables, seqs) for p in range(c, c + n)]
    positions = [p for c, n in seqs for p in range(c, c + n)]
    return tables, slots, positions, (sum(need) + 1) * BLOCK


def batches(seqs, tables, slots, positions, device: str) -> tuple[AttentionBatch, AttentionBatch, float, float]:
    """The sdpa path's batch (padded groups) and the triton path's (PagedTables), with the host ms to build each."""
    t0 = time.perf_counter()
    starts = [0]
    for _, n in seqs[:-1]:
        starts.append(starts[-1] + n)
    group = build_group(starts, [c for c, _ in seqs], [n for _, n in seqs], tables, BLOCK, device)
    pos_t = torch.tensor(positions, device=device)
    slot_t = torch.tensor(slots, device=device)
    grouped = AttentionBatch(pos_t, slot_t, [group], max(positions) + 1)
    t1 = time.perf_counter()
    width = max(len(t) for t in tables)
    as_i32 = dict(dtype=torch.int32, device=device)
    decode = all(n == 1 for _, n in seqs)
    paged = PagedTables(torch.tensor([t + [0] * (width - len(t)) for t in tables], **as_i32),
                        torch.tensor([c + n for c, n in seqs], **as_i32), BLOCK, decode,
                        torch.tensor(starts, **as_i32), torch.tensor([n for _, n in seqs], **as_i32),
                        torch.tensor([c for c, _ in seqs], **as_i32), max(n for _, n in seqs))
    tables_batch = AttentionBatch(pos_t, slot_t, [], max(positions) + 1, paged)
    t2 = time.perf_counter()
    return grouped, tables_batch, (t1 - t0) * 1e3, (t2 - t1) * 1e3


def flex_call(seqs, group):
    """flex_attention over the sdpa path's gathered K/V, with a block mask of the sequences' lengths."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    compiled = torch.compile(flex_attention, dynamic=False)
    b, q_len, k_len = group.shape
    q_pos = torch.tensor([[c + min(i, n - 1) for i in range(q_len)] for c, n in seqs], device=group.mask.device)

    def causal(bi, h, qi, ki):
        return ki <= q_pos[bi, qi]
    mask = create_block_mask(causal, b, None, q_len, k_len, device=group.mask.device)

    def run(q, cache: LayerKV, k_new, v_new, slot_t):
        cache.write(slot_t, k_new, v_new)
        kg, vg = cache.read(group.kv_slots, q.dtype)
        qg = q.index_select(0, group.token_index).view(b, q_len, H, D).transpose(1, 2)
        kg, vg = (x.view(b, k_len, KVH, D).transpose(1, 2) for x in (kg, vg))
        o = compiled(qg, kg, vg, block_mask=mask, enable_gqa=True)
        return o.transpose(1, 2).reshape(b * q_len, H, D).index_select(0, group.valid_rows)
    return run


def reference(q, kv, tables, seqs) -> torch.Tensor:
    out, row = [], 0
    for t, (c, n) in zip(tables, seqs):
        keys = torch.tensor([t[p // BLOCK] * BLOCK + p % BLOCK for p in range(c + n)], device=kv.device)
        k, v = (kv[i].index_select(0, keys).double().transpose(0, 1) for i in (0, 1))
        mask = torch.arange(c + n, device=kv.device)[None, :] <= torch.arange(c, c + n, device=kv.device)[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(q[row:row + n].double().transpose(0, 1), k, v,
                                                             attn_mask=mask, enable_gqa=True)
        out.append(o.transpose(0, 1))
        row += n
    return torch.cat(out)


def timed(fn, device: str) -> float:
    if device.startswith("cuda"):
        from triton.testing import do_bench
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return sorted(samples)[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="two small cases, float32: a check of the script itself")
    args = ap.parse_args()
    rng, dev = random.Random(0), args.device
    dtype = torch.float32 if args.quick else torch.bfloat16
    cases = [("decode", [(40, 1), (70, 1)], "2 seqs"), ("prefill", [(0, 40), (20, 9)], "2 chunks")] \
        if args.quick else CASES
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if dev.startswith("cuda") else "CPU"
    print(f"{name}, torch {torch.__version__}; H={H} KVH={KVH} D={D} block {BLOCK}, {dtype}")
    print(f"{'phase':8} {'case':34} {'sdpa ms':>9} {'flex ms':>9} {'triton ms':>10}  {'best':7} "
          f"{'rel.err s/f/t':>22}  host ms groups/tables")
    for phase, spec, label in cases:
        seqs = shapes(spec, rng)
        tables, slots, positions, num_slots = layout(seqs, rng, dev)
        kv = torch.randn(2, num_slots, KVH, D, device=dev, dtype=dtype)
        cache = LayerKV(kv)
        t = len(positions)
        q = torch.randn(t, H, D, device=dev, dtype=dtype)
        k_new, v_new = (torch.randn(t, KVH, D, device=dev, dtype=dtype) for _ in range(2))
        grouped, paged, host_groups, host_tables = batches(seqs, tables, slots, positions, dev)
        cache.write(grouped.slot_mapping, k_new, v_new)
        ref = reference(q, kv, tables, seqs)
        runs = {"sdpa": lambda: paged_attention(q, k_new, v_new, cache, grouped),
                "triton": lambda: paged_attention(q, k_new, v_new, cache, paged)}
        try:
            flex = flex_call(seqs, grouped.groups[0])
            runs["flex"] = lambda: flex(q, cache, k_new, v_new, grouped.slot_mapping)
        except Exception as e:  # noqa: BLE001 - a variant that cannot run is reported, not fatal
            print(f"  flex unavailable for {label}: {type(e).__name__}: {str(e)[:200]}")
        times, errors = {}, {}
        for name, fn in runs.items():
            try:
                out = fn()
                errors[name] = ((out.double() - ref).norm() / ref.norm()).item()
                times[name] = timed(fn, dev)
            except Exception as e:  # noqa: BLE001
                print(f"  {name} failed for {label}: {type(e).__name__}: {str(e)[:300]}")
        best = min(times, key=times.get) if times else "-"
        cell = lambda n: f"{times[n]:9.4f}" if n in times else f"{'-':>9}"  # noqa: E731
        err = "/".join(f"{errors[n]:.0e}" if n in errors else "-" for n in ("sdpa", "flex", "triton"))
        print(f"{phase:8} {label:34} {cell('sdpa')} {cell('flex')} {cell('triton'):>10}  {best:7} {err:>22}  "
              f"{host_groups:6.2f}/{host_tables:.2f}")


if __name__ == "__main__":
    main()
