"""How close a decode step runs to the machine's memory bandwidth: the roofline of a memory-bound step.

One decode step at batch 1 reads every weight once (the embedding only where it is also the LM head), so
tokens/s x bytes of weights per token is the bandwidth it achieved; a large copy measures what the machine can
give. Benches print one as a fraction of the other, so a gap shows as physics, not only as a ratio.
"""

from __future__ import annotations

import time

import torch

from engine.int4 import Int4Linear
from engine.int8 import Int8Linear
from engine.models.llama import LlamaModel
from engine.threads import in_passing_thread


def memory_bandwidth(size_bytes: int = 512 * 2**20, reps: int = 5, threads: int | None = None) -> float:
    """GB/s (bytes read plus bytes written, per second) of the fastest of `reps` copies of a buffer far larger
    than the caches, on `threads` OpenMP threads (default: torch's). Runs on a passing thread, so the caller
    keeps no OpenMP team (engine/threads.py)."""
    return in_passing_thread(_copy_bandwidth, size_bytes, reps, threads)


def _copy_bandwidth(size_bytes: int, reps: int, threads: int | None) -> float:
    if threads:
        torch.set_num_threads(threads)
    src = torch.ones(size_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in before timing
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * size_bytes / best / 1e9


def decode_bytes(model: LlamaModel) -> int:
    """Bytes of weights one decode step reads: quantized layers and head as packed (their dense copies serve
    prompts only), everything else as stored, the embedding only where it is the (dense) LM head."""
    head = "embed_tokens.weight" if model.lm_head is None else "lm_head.weight"
    skip = {"embed_tokens.weight"} | ({head} if model.packed_head is not None else set())
    dense = _nbytes(*(p for name, p in model.named_parameters() if name not in skip))
    packed = sum(_nbytes(*m.packed_tensors(), m.bias) for m in model.modules() if isinstance(m, Int4Linear)) \
        + sum(_nbytes(m.q, m.scale, m.bias) for m in model.modules() if isinstance(m, Int8Linear))
    tied = model.lm_head is None and model.packed_head is None
    return dense + packed + (_nbytes(model.embed_tokens.weight) if tied else 0)


def gguf_decode_bytes(path: str) -> int:
    """The same for llama.cpp on a GGUF file: every tensor as stored, token_embd only if there is no output."""
    import gguf
    tensors = gguf.GGUFReader(path).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    return sum(int(t.n_bytes) for t in tensors if t.name != "token_embd.weight" or tied)


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
