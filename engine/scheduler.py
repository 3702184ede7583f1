"""Continuous batching: decide which tokens of which sequences run in the next model step.

Each step: running sequences decode one token each (oldest first), unfinished prefills continue in
chunks, and waiting sequences are admitted (FCFS) while the token budget and KV memory last. When a
decode cannot get a block, the newest running sequence is preempted by recompute: its blocks are
released and it goes back to the front of the queue. The scheduler never touches tensors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.kv_cache import BlockManager
from engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledItem:
    """Compute positions [start, start + num_tokens) of seq this step."""
    seq: Sequence
    start: int
    num_tokens: int
    slots: list[int] = field(default_factory=list)  # KV slot of each computed position
    samples: bool = False  # reaches the end of the known tokens: the runner must sample one
    draft: list[int] = field(default_factory=list)  # speculative tokens after the known ones, to verify

    @property
    def end(self) -> int:
        """Context length the attention reads (positions [0, end))."""
        return self.start + self.num_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids(self.start, self.end - len(self.draft)) + self.draft


@dataclass
class StepPlan:
    items: list[ScheduledItem] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) blocks to copy first
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(item.num_tokens for item in self.items)

    @property
    def is_empty(self) -> bool:
        return not self.items

    @property
    def sampling(self) -> list[ScheduledItem]:
        """The items that sample this step, in plan order: the rows of the runner's logits."""
        return [item for item in self.items if item.samples]


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int = 64, max_step_tokens: int = 2048,
                 prefill_chunk: int = 512):
        assert max_num_seqs >= 1 and max_step_tokens >= 1 and prefill_chunk >= 1
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_step_tokens = max_step_tokens
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last one is preempted first

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def add(self, seq: Sequence) -> None:
        """Queue seq. Raises ValueError if it could never fit in KV memory, even alone."""
        assert seq.status is SequenceStatus.WAITING and not seq.block_table
        worst = self.blocks.blocks_needed(seq.num_prompt_tokens + seq.max_tokens - 1)
        if worst > self.blocks.num_blocks:
            raise ValueError(f"sequence {seq.seq_id} needs up to {worst} KV blocks, "
                             f"the cache has {self.blocks.num_blocks}")
        self.waiting.append(seq)

    def abort(self, seq_id: int) -> Sequence | None:
        """Finish seq_id now (call between steps). Its computed full blocks stay cached."""
        seq = next((s for s in (*self.running, *self.waiting) if s.seq_id == seq_id), None)
        if seq is None:
            return None
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.free(seq)
        else:
            self.waiting.remove(seq)
        self._finish(seq, "abort")
        return seq

    def fork(self, parent: Sequence, seq_id: int) -> Sequence:
        """A running copy of a decoding parent that shares its KV blocks (parallel sampling)."""
        assert parent.status is SequenceStatus.RUNNING and not parent.is_prefilling
        child = Sequence(seq_id, parent.prompt_ids, parent.max_tokens, parent.stop_token_ids,
                         list(parent.output_ids), SequenceStatus.RUNNING, cache_scope=parent.cache_scope)
        self.blocks.fork(parent, child)
        self.running.append(child)
        return child

    def schedule(self, drafts: dict[int, list[int]] | None = None) -> StepPlan:
        """The next step's work; empty only when there is none. The runner, per item, computes
        item.token_ids at positions [item.start, item.end) into item.slots, attends over
        item.seq.block_table up to item.end, and samples a token where item.samples (verifies the
        item.draft tokens, seq_id -> drafts in `drafts`, where memory and budget allow); it performs
        plan.copies (whole KV blocks, src -> dst) before writing anything."""
        plan = StepPlan()
        budget = self.max_step_tokens
        drafts = drafts or {}
        for seq in list(self.running):
            if budget and seq.status is SequenceStatus.RUNNING and not seq.is_prefilling:
                budget -= self._schedule_decode(seq, plan, drafts.get(seq.seq_id, []), budget)
        for seq in self.running:
            if budget and seq.is_prefilling:
                budget -= self._schedule_chunk(seq, plan, budget)
        admit = not plan.preempted or not plan.items  # no admissions while memory is thrashing
        deferred: list[Sequence] = []
        while admit and budget and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self._follows(seq):
                deferred.append(self.waiting.popleft())
                continue
            if not self.blocks.allocate_prompt(seq):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget -= self._schedule_chunk(seq, plan, budget)
        self.waiting.extendleft(reversed(deferred))
        return plan

    def postprocess(self, plan: StepPlan, sampled: dict[int, int | list[int]]) -> list[Sequence]:
        """Record a step's results: advance progress, append sampled tokens (seq_id -> token, or the
        kept drafts plus the target's token for an item with a draft; exactly for the items whose
        `samples` is True), release the KV blocks of rejected drafts, finish and free the sequences that
        Sequence.append says are done (stop token, length, stop string). Returns them."""
        finished = []
        for item in plan.items:
            seq = item.seq
            if seq.status is not SequenceStatus.RUNNING:  # aborted after scheduling
                continue
            assert seq.num_computed == item.start, "plan applied twice or out of order"
            seq.num_computed = item.end
            if not item.samples:
                assert seq.seq_id not in sampled, "sampled a token mid-prompt"
                self.blocks.cache_computed(seq)
                continue
            tokens = sampled[seq.seq_id]
            tokens = tokens if isinstance(tokens, list) else [tokens]
            reason = seq.append(tokens)
            # K/V is valid up to the last kept draft, and only for tokens the sequence still holds
            seq.num_computed = min(item.end - len(item.draft) + len(tokens) - 1, seq.num_tokens)
            if reason:
                self.running.remove(seq)
                self.blocks.free(seq)
                self._finish(seq, reason)
                finished.append(seq)
            elif item.draft:
                self.blocks.release_rejected_blocks(seq)
            elif item.start < seq.num_prompt_tokens:  # its prompt's last chunk
                self.blocks.cache_computed(seq)
        return finished

    # -- internals ---------------------------------------------------------------------------

    def _follows(self, seq: Sequence) -> bool:
        """Whether a running sequence is still computing a prompt page that seq would reuse: seq waits for it, as
        the radix cache gets each chunk once it is done (BlockManager.cache_computed), rather than computing the
        same prefix beside it. Four requests sharing a 2,000-token system prompt sent at once each computed it."""
        if self.blocks.cache is None:  # nothing to reuse: waiting would only serialize their prompts
            return False
        bs = self.blocks.block_size
        for other in self.running:
            if other.is_prefilling and other.cache_scope == seq.cache_scope:
                reused = other.num_computed // bs * bs + bs  # through the next page `other` computes
                if reused < seq.num_tokens and seq.all_ids[:reused] == other.all_ids[:reused]:
                    return True
        return False

    def _schedule_decode(self, seq: Sequence, plan: StepPlan, draft: list[int], budget: int) -> int:
        """Schedule seq's pending token, preempting newest sequences for memory, and its draft tokens if
        budget and free memory allow (drafts never preempt). Returns tokens used."""
        if draft and (len(draft) >= budget or not self.blocks.can_append(seq, 1 + len(draft))):
            draft = []
        while not self.blocks.can_append(seq, 1):
            victim = self.running[-1]
            self._preempt(victim, plan)
            if victim is seq:
                return 0
        self._add_item(seq, 1 + len(draft), plan, draft)
        return 1 + len(draft)

    def _schedule_chunk(self, seq: Sequence, plan: StepPlan, budget: int) -> int:
        """Schedule the next prefill chunk; its blocks were reserved at admission, so it always fits."""
        n = min(seq.num_uncomputed, self.prefill_chunk, budget)
        self._add_item(seq, n, plan)
        return n

    def _add_item(self, seq: Sequence, n: int, plan: StepPlan, draft: list[int] = ()) -> None:
        copies = self.blocks.append_slots(seq, n)
        assert copies is not None, "append_slots failed after can_append"
        plan.copies += copies
        start, end = seq.num_computed, seq.num_computed + n
        plan.items.append(ScheduledItem(seq, start, n, self.blocks.slot_mapping(seq, start, end),
                                        samples=end - len(draft) == seq.num_tokens, draft=list(draft)))

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.running.remove(seq)
        self.blocks.free(seq, cache=False)
        seq.status = SequenceStatus.WAITING
        seq.num_computed = 0
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)

    @staticmethod
    def _finish(seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
