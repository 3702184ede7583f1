"""A draft model for speculative decoding: a smaller model with the target's tokenizer, its own paged KV cache and
its own block manager, proposing k tokens per step for the target to verify (engine/speculative.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from engine.kv_cache import BlockManager
from engine.loader import load
from engine.model_runner import ModelRunner, StepInput
from engine.models.llama import LlamaModel
from engine.sampling import SampleRow, probabilities
from engine.sequence import Sequence
from engine.speculative import Draft
from engine.tokenizer import Tokenizer


class DraftModelProposer:
    """A smaller model with the target's tokenizer. Keeps a mirror sequence per target sequence in its
    own paged KV cache; each sync rolls the mirror back to what the target kept, so only the tokens
    new since the last step (usually the target's correction) are recomputed before drafting.

    With `vocab`, the draft's LM head scores only token ids below it, plus the ids already in the sequences
    being drafted for (what an edit copies), as FR-Spec does (Zhao et al., 2025): a byte-level BPE numbers
    its tokens in merge order, so low ids are the frequent ones. A large vocabulary's head is a big share of
    a small draft's step (18 of ~60 ms for Qwen2.5-0.5B's 151,936 rows on 2 cores); the target still
    verifies over every token, so outputs stay exact and only acceptance can suffer."""

    def __init__(self, runner: ModelRunner, num_blocks: int, block_size: int, cost: float, vocab: int = 0):
        self.runner = runner
        self.cost = cost  # one draft step relative to one target step
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_cache=False)
        self.mirrors: dict[int, Sequence] = {}
        self.vocab = vocab if 0 < vocab < runner.model.cfg.vocab_size else None  # None: all of it

    @classmethod
    def for_target(cls, model: LlamaModel, target: LlamaModel, num_blocks: int, block_size: int,
                   vocab: int = 0, cuda_graphs: bool = True, max_batch: int = 256) -> "DraftModelProposer":
        """model drafting for target, its cost per step taken as its share of the target's parameters (those
        its head scores). cuda_graphs, max_batch: as the ModelRunner's (the engine's setting and its speculative
        batch); a head scoring part of the vocabulary never runs in a graph, so it gets none."""
        graphs = cuda_graphs and not 0 < vocab < model.cfg.vocab_size
        return cls(ModelRunner(model, num_blocks, block_size, cuda_graphs=graphs, max_batch=max_batch), num_blocks,
                   block_size, draft_cost(model, target, vocab), vocab)

    def propose(self, seqs: list[Sequence], ks: list[int], rows: list[SampleRow],
                generator: torch.Generator) -> list[Draft]:
        """Draft ks[i] tokens for each seq in one batched draft step per token; greedy rows take the
        draft's argmax, sampled rows draw from the draft's processed distribution q."""
        mirrors = [self._sync(s) for s in seqs]
        ids = self._scored_ids(mirrors)
        head = None if ids is None else self._head(ids)
        drafts = [Draft([], None) for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        for _ in range(max(ks, default=0)):
            active = [i for i, m in enumerate(mirrors) if m is not None and len(drafts[i].tokens) < ks[i]
                      and self.blocks.append_slots(m, m.num_uncomputed) is not None]
            if not active:
                break
            logits = self.runner.execute([self._input(mirrors[i]) for i in active], head=head).float().cpu()
            for row, i in zip(logits, active):
                m, r = mirrors[i], rows[i]
                m.num_computed = m.num_tokens
                if r.params.greedy:
                    choice = int(row.argmax())
                else:
                    q = probabilities(row[None], [r])[0]
                    choice = int(torch.multinomial(q, 1, generator=r.generator or generator))
                    probs[i].append(q if ids is None else self._full(q, ids))
                token = choice if ids is None else int(ids[choice])
                m.output_ids.append(token)
                drafts[i].tokens.append(token)
        for d, p in zip(drafts, probs):
            d.probs = torch.stack(p) if p else None
        return drafts

    def _scored_ids(self, mirrors: list[Sequence | None]) -> torch.Tensor | None:
        """The token ids the head scores, ascending: 0..vocab-1, then the sequences' own ids above it."""
        if self.vocab is None:
            return None
        seen = [np.asarray(m.all_ids, dtype=np.int64) for m in mirrors if m is not None]
        extra = np.unique(np.concatenate(seen)) if seen else np.zeros(0, np.int64)
        return torch.cat([torch.arange(self.vocab), torch.from_numpy(extra[extra >= self.vocab])])

    def _head(self, ids: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        weight = self.runner.model.head_weight
        rows = [weight[:self.vocab]]  # a view: no copy of the frequent rows
        if len(ids) > self.vocab:
            rows.append(weight.index_select(0, ids[self.vocab:].to(weight.device)))
        return lambda hidden: torch.cat([F.linear(hidden, w) for w in rows], dim=-1).float()

    def _full(self, q: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """q over the scored ids as a distribution over the whole vocabulary (0 elsewhere), as verification
        needs it."""
        return torch.zeros(self.runner.model.cfg.vocab_size, dtype=q.dtype).index_copy_(0, ids, q)

    def retain(self, seq_ids: set[int]) -> None:
        """Free the mirrors of sequences that finished or were preempted."""
        for sid in [s for s in self.mirrors if s not in seq_ids]:
            self.blocks.free(self.mirrors.pop(sid), cache=False)

    def _sync(self, seq: Sequence) -> Sequence | None:
        """The mirror of seq holding seq's tokens, with K/V kept for the longest still-valid prefix.
        The target only appends, so the mirror's prompt is a prefix of seq; its drafts count while equal."""
        m = self.mirrors.get(seq.seq_id)
        if m is None:
            m = Sequence(seq.seq_id, seq.all_ids, 1)
            if not self.blocks.allocate_prompt(m):
                return None
            self.mirrors[seq.seq_id] = m
            return m
        base = m.num_prompt_tokens
        kept = seq.token_ids(base, base + len(m.output_ids))
        same = next((i for i, (a, b) in enumerate(zip(m.output_ids, kept)) if a != b), len(kept))
        m.num_computed = min(m.num_computed, base + same, seq.num_tokens - 1)  # recompute the last for its logits
        m.prompt_ids, m.output_ids = seq.all_ids, []
        self.blocks.release_rejected_blocks(m)
        return m

    def _input(self, m: Sequence) -> StepInput:
        start, end = m.num_computed, m.num_tokens
        return StepInput(m.token_ids(start, end), start, self.blocks.slot_mapping(m, start, end), m.block_table, True)


def load_draft(path: str, target: LlamaModel, target_tokenizer: Tokenizer, num_blocks: int, block_size: int,
               dtype: torch.dtype, device: str, progress: bool, vocab: int = 0, int4: bool = True,
               cuda_graphs: bool = True, max_batch: int = 256) -> DraftModelProposer:
    """Load a draft model; its vocabulary must be the target's, token for token."""
    loaded = load(path, dtype, device, progress=progress, int4=int4)
    if loaded.model.cfg.vocab_size != target.cfg.vocab_size or \
            loaded.tokenizer.tk.get_vocab(with_added_tokens=True) != \
            target_tokenizer.tk.get_vocab(with_added_tokens=True):
        raise ValueError(f"draft model {path}: its vocabulary differs from the target model's")
    return DraftModelProposer.for_target(loaded.model, target, num_blocks, block_size, vocab, cuda_graphs, max_batch)


def draft_cost(draft: LlamaModel, target: LlamaModel, vocab: int = 0) -> float:
    """One draft step relative to one target step: the draft's share of the parameters, less the head rows
    it does not score."""
    cfg = draft.cfg
    unscored = max(0, cfg.vocab_size - vocab) * cfg.hidden_size if vocab > 0 else 0
    return (draft.num_parameters - unscored) / target.num_parameters
