"""Tensors in, logits out: owns the model and the paged KV cache, never decides policy.

The KV cache is one tensor per engine, `(layers, 2, slots, kv_heads, head_dim)` (int8 with scales beside it
for an int8 cache, engine/kv_store.py), sized from a memory budget; slot `block * block_size + offset` holds
one token's K and V for every layer.

On CUDA, attention runs as Triton kernels over the block tables (engine/triton_attention.py) and decode steps are
replayed as CUDA graphs (engine/cuda_graphs.py); on CPU, and for an int8 cache, SDPA over gathered blocks.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engine import kv_store
from engine.attention import AttentionBatch, AttentionGroup, PagedTables, build_group
from engine.cuda_graphs import DecodeGraphs, fill_rows, on_device
from engine.models.llama import LlamaModel, fused_kernels


class GroupKind(enum.Enum):
    """The attention groups of a step, built in this order: the inputs of one kind share one padded group."""
    DECODE = "decode"    # one new token each
    VERIFY = "verify"    # a pending token plus speculative drafts, logits for each
    PREFILL = "prefill"  # a prompt chunk


@dataclass
class StepInput:
    """One sequence's share of a step: tokens at positions [start, start + len(token_ids))."""
    token_ids: list[int]
    start: int
    slots: list[int]          # cache slot of each of those positions
    block_table: list[int]    # the sequence's blocks, covering positions [0, start + len(token_ids))
    samples: bool             # whether to return logits for its last token
    num_logits: int = 1       # with samples: logits for this many last tokens (speculative verification)
    prompt: bool = False      # computes prompt positions: the whole step runs dense (LlamaModel.forward's quantized)

    @property
    def kind(self) -> GroupKind:
        if len(self.token_ids) == 1:
            return GroupKind.DECODE
        return GroupKind.VERIFY if self.num_logits > 1 else GroupKind.PREFILL


def num_blocks_for(model: LlamaModel, kv_memory: int | float, block_size: int, dtype: torch.dtype,
                   device: str, kv_int8: bool = False) -> int:
    """Blocks that fit in kv_memory: bytes if > 1, else that fraction of the memory free right now."""
    if kv_memory <= 1:
        if (dev := torch.device(device)).type == "cuda":
            # and what torch's caching allocator holds unused: an engine unloaded in this process left its memory
            # there, unseen by the driver, and reloaded got a fraction of the rest (0.5: about a quarter of its first
            # cache)
            free = torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        else:
            import os
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        kv_memory = free * kv_memory
    return max(1, int(kv_memory) // (kv_store.bytes_per_token(model.cfg, dtype, kv_int8) * block_size))


class ModelRunner:
    """`compile`: decode steps (one new token per sequence) run through torch.compile's inductor, which fuses a
    layer's small ops into a few C++ kernels: a step is hundreds of ops, each with a fixed cost in eager mode.
    Two graphs, one sequence and several (sizes are symbolic otherwise), compiled by `warm_up`."""

    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, kv_int8: bool = False,
                 compile: bool = False, cuda_graphs: bool = True, max_batch: int = 256):
        weight = model.embed_tokens.weight
        self.model, self.block_size, self.device = model, block_size, weight.device
        # Triton kernels on CUDA where they apply: the compute dtype's cache (not int8), a power-of-two head size
        self.triton = weight.is_cuda and not kv_int8 and model.cfg.head_dim in (16, 32, 64, 128, 256)
        # one more block on CUDA: the scratch block padded graph rows read and write
        self.kv, self.kv_scales = kv_store.allocate(model.cfg, (num_blocks + self.triton) * block_size, weight.dtype,
                                                    kv_int8, weight.device)
        self.caches = [kv_store.LayerKV(self.kv[i], None if self.kv_scales is None else self.kv_scales[i])
                       for i in range(model.cfg.num_layers)]
        # the fused kernels run on one thread: they are tiny, and a thread count fixed into them at compile time
        # would defeat ThreadBudget (engine/threads.py); the matmuls they call follow torch's count
        self._compiled = torch.compile(model, dynamic=True, options={"cpp.threads": 1}) if compile else None
        self.graphs, self.fuse_graphs = None, True
        if self.triton and cuda_graphs:
            max_blocks = -(-min(model.cfg.max_position, num_blocks * block_size) // block_size)
            self.graphs = DecodeGraphs(self._decode_logits, max_batch, max_blocks, block_size, num_blocks,
                                       self.device)

    def warm_up(self) -> None:
        """Run decode steps of one and of two sequences in block 0 (free until a sequence takes it, which writes
        its own K/V before reading them), so compiling happens now rather than in a request's first steps.
        Positions 5 and 6: sizes 0 and 1 would be compiled as constants, equal sizes as one."""
        table = [0] * (7 // self.block_size + 1)
        for batch in (1, 2):
            self.execute([StepInput([0], p, [p % self.block_size], table, True) for p in (5, 6)[:batch]])

    @torch.inference_mode()
    def execute(self, inputs: list[StepInput], copies: list[tuple[int, int]] = (),
                head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """Run one step; returns float logits (n, vocab): the last num_logits tokens of each input with
        `samples`, in order. `head` replaces the model's LM head (a draft scoring part of the vocabulary)."""
        self._copy_blocks(copies)
        if self.graphs is not None and head is None and all(x.kind is GroupKind.DECODE and x.samples for x in inputs) \
                and self.graphs.fits([x.block_table for x in inputs]):
            assert max(x.start for x in inputs) < self.model.cfg.max_position, "a position past the model's context"
            return self.graphs.run([x.token_ids[0] for x in inputs], [x.start for x in inputs],
                                   [x.slots[0] for x in inputs], [x.block_table for x in inputs])
        token_starts = [0, *itertools.accumulate(len(x.token_ids) for x in inputs)][:-1]
        positions = self._tensor([p for x in inputs for p in range(x.start, x.start + len(x.token_ids))])
        slots = self._tensor([s for x in inputs for s in x.slots])
        ids = self._tensor([t for x in inputs for t in x.token_ids])
        num_positions = max(x.start + len(x.token_ids) for x in inputs)
        quantized = not any(x.prompt for x in inputs)
        if self.triton:  # any mix of prompt chunks, verifications and decodes in one launch a layer, nothing padded
            batch = AttentionBatch(positions, slots, [], num_positions, self._paged_tables(inputs, token_starts))
            with on_device(self.device):  # the Triton kernels run on the current device
                hidden = self.model(ids, batch, self.caches, quantized)
        else:
            batch = AttentionBatch(positions, slots, self._groups(inputs, token_starts), num_positions)
            decode = self._compiled is not None and all(x.kind is GroupKind.DECODE for x in inputs)
            hidden = (self._compiled if decode else self.model)(ids, batch, self.caches, quantized=quantized)
        last = [token_starts[i] + len(x.token_ids) - n for i, x in enumerate(inputs) if x.samples
                for n in range(x.num_logits, 0, -1)]
        hidden = hidden.index_select(0, self._tensor(last))
        return head(hidden) if head else self.model.logits(hidden, quantized=quantized)

    def _decode_logits(self, ids: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """A decode step from token ids to float logits, all on the GPU: what a CUDA graph captures, with
        RMSNorm, RoPE and SwiGLU fused where `fuse_graphs` (engine/models/llama.py says why graphs only)."""
        with fused_kernels(self.fuse_graphs):
            return self.model.logits(self.model(ids, batch, self.caches, quantized=True), quantized=True)

    def _groups(self, inputs: list[StepInput], token_starts: list[int]) -> list[AttentionGroup]:
        """One padded group per kind of input (SDPA over gathered blocks: the CPU path)."""
        groups = []
        for kind in GroupKind:
            idx = [i for i, x in enumerate(inputs) if x.kind is kind]
            if idx:
                groups.append(build_group([token_starts[i] for i in idx], [inputs[i].start for i in idx],
                                          [len(inputs[i].token_ids) for i in idx],
                                          [inputs[i].block_table for i in idx], self.block_size, self.device))
        return groups

    def _paged_tables(self, inputs: list[StepInput], token_starts: list[int]) -> PagedTables:
        """The inputs' block tables and spans for the Triton kernels, in two host-to-device copies."""
        q_lens = [len(x.token_ids) for x in inputs]
        ctx = [x.start for x in inputs]
        small = torch.tensor([token_starts, q_lens, ctx, [c + n for c, n in zip(ctx, q_lens)]],
                             dtype=torch.int32).to(self.device)
        width = max(len(x.block_table) for x in inputs)
        rows = fill_rows(np.empty((len(inputs), width), dtype=np.int32), [x.block_table for x in inputs], 0)
        return PagedTables(torch.from_numpy(rows).to(self.device), small[3], self.block_size, decode=max(q_lens) == 1,
                           q_starts=small[0], q_lens=small[1], ctx=small[2], max_q_len=max(q_lens))

    @torch.inference_mode()
    def hidden_states(self, token_ids: list[int]) -> torch.Tensor:
        """Final hidden states (T, hidden) of one sequence, without touching the KV cache."""
        n = len(token_ids)
        batch = AttentionBatch(self._tensor(list(range(n))), None,
                               [build_group([0], [0], [n], None, self.block_size, self.device)], n)
        return self.model(self._tensor(token_ids), batch, quantized=False)

    def _copy_blocks(self, copies) -> None:
        """Copy-on-write: duplicate whole blocks (all layers, K and V) before anyone writes to them."""
        if not copies:
            return
        bs = self.block_size
        src = torch.cat([torch.arange(s * bs, (s + 1) * bs) for s, _ in copies]).to(self.device)
        dst = torch.cat([torch.arange(d * bs, (d + 1) * bs) for _, d in copies]).to(self.device)
        self.kv[:, :, dst] = self.kv[:, :, src]
        if self.kv_scales is not None:
            self.kv_scales[:, :, dst] = self.kv_scales[:, :, src]

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
