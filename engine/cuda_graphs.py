"""Decode steps on CUDA replayed as CUDA graphs, one per batch-size bucket.

A decode step of a 1B model is ~400 kernel launches of a few microseconds each; launched one by one from Python
the GPU waits on the CPU (eager batch-1 decode is launch-bound). A graph replays the whole step as one launch.
Shapes must not change between replays, so a step is padded to the next bucket: padding rows read and write a
scratch block no sequence owns. Attention is the Triton decode kernel (engine/triton_attention.py), whose shapes
depend on the batch alone; K/V reach it through the block tables, copied into fixed buffers before each replay.
Every bucket up to the engine's max_num_seqs is captured while the engine loads (`capture_all`), sharing one
memory pool: captured on first use instead, a batch that shrank as its sequences finished paid a capture at each
bucket it passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import AttentionBatch, PagedTables

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # vLLM's sizes up to 256: padding wastes at most half a bucket


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # (bucket, vocab) float, written by each replay


class DecodeGraphs:
    """`run(ids, positions, slots, tables)` -> logits (len(ids), vocab): one decode step, replayed.

    `forward(batch_inputs)` is the step to capture: token ids (B,), an AttentionBatch -> float logits (B, vocab).
    `scratch_block` is a cache block the block manager never hands out."""

    def __init__(self, forward: Callable[[torch.Tensor, AttentionBatch], torch.Tensor], max_batch: int,
                 max_blocks: int, block_size: int, scratch_block: int, device: torch.device):
        self.forward, self.block_size, self.scratch_block, self.device = forward, block_size, scratch_block, device
        self.max_batch = next((b for b in BUCKETS if b >= max_batch), BUCKETS[-1])
        n, self.max_blocks = self.max_batch, max_blocks
        # rows: token ids, positions, cache slots, key counts; padding rows write and read the scratch block
        padding = torch.tensor([0, 0, scratch_block * block_size, 1])[:, None].expand(4, n)
        self.inputs = padding.to(device).contiguous()
        self.tables = torch.full((n, max_blocks), scratch_block, dtype=torch.int32, device=device)
        # pinned staging, written in place each step: allocating pinned memory per step cost more than the copy; a
        # step's copies are done before the next writes here, since every step waits for its logits
        self._staged_inputs = padding.contiguous().pin_memory()
        self._staged_tables = torch.empty((n, max_blocks), dtype=torch.int32).pin_memory()
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[int, _Captured] = {}

    def fits(self, tables: list[list[int]]) -> bool:
        """Whether a decode step of sequences with these block tables has a graph."""
        return len(tables) <= self.max_batch and max(map(len, tables)) <= self.max_blocks

    def capture_all(self) -> None:
        """Capture every bucket now. The buffers hold padding rows only, so the warm-up steps before each capture
        write to the scratch block alone."""
        with on_device(self.device):
            for size in BUCKETS:
                if size <= self.max_batch and size not in self._graphs:
                    self._capture(size)

    def run(self, ids: list[int], positions: list[int], slots: list[int], tables: list[list[int]]) -> torch.Tensor:
        b, size = len(ids), next(s for s in BUCKETS if s >= len(ids))
        width = max(len(t) for t in tables)
        staged = self._staged_inputs.numpy()
        staged[:, :b] = [ids, positions, slots, [p + 1 for p in positions]]
        staged[:, b:size] = [[0], [0], [self.scratch_block * self.block_size], [1]]  # last step's rows, reset
        fill_rows(self._staged_tables.numpy()[:size, :width], tables, self.scratch_block)
        self.inputs[:, :size].copy_(self._staged_inputs[:, :size], non_blocking=True)
        self.tables[:size, :width].copy_(self._staged_tables[:size, :width], non_blocking=True)
        with on_device(self.device):  # a replay runs on the current device's stream
            captured = self._graphs.get(size) or self._capture(size)
            captured.graph.replay()
        return captured.logits[:b].clone()  # the next replay overwrites the buffer; a caller may keep these

    def _batch(self, size: int) -> AttentionBatch:
        paged = PagedTables(self.tables[:size], self.inputs[3, :size], self.block_size, decode=True)
        # num_positions is checked on the host before each replay (ModelRunner), not by the captured step
        return AttentionBatch(self.inputs[1, :size], self.inputs[2, :size], [], 1, paged)

    def _capture(self, size: int) -> _Captured:
        batch = self._batch(size)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # Triton compiles and cuBLAS picks its kernels outside the capture
            for _ in range(2):
                self.forward(self.inputs[0, :size], batch)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # on this stream, of this device: torch's default capture stream is one per process, made on whichever device
        # was current at the first capture, so a second engine's device was never captured
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):
            logits = self.forward(self.inputs[0, :size], batch)
        self._graphs[size] = _Captured(graph, logits)
        return self._graphs[size]


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """`device` as the current CUDA device within: Triton launches a kernel on the current device, and a CUDA graph
    captures and replays on the current device's stream, whatever device the tensors are on (an engine on cuda:1
    with cuda:0 current ran its attention, and captured its graphs, on cuda:0). Nothing on a CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def fill_rows(out: np.ndarray, tables: list[list[int]], fill: int) -> np.ndarray:
    """out (rows, width) int32: row i is tables[i], then `fill`; rows past the tables all `fill`. Through numpy:
    2.6x faster than torch.tensor of padded lists (256 tables of 64 blocks)."""
    out.fill(fill)
    for i, table in enumerate(tables):
        out[i, :len(table)] = table
    return out
