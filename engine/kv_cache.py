"""Paged KV memory: refcounted physical blocks, per-sequence block tables, prefix reuse, copy-on-write.

A block's refcount is the number of holders: each sequence whose block table lists it, plus one if
the radix cache holds it. A block is written only while exactly one holder has it; `append_slots`
hands back (src, dst) copies for shared blocks in the write range. Plain Python, no tensors: the
model runner turns block tables and slot mappings into tensors.
"""

from __future__ import annotations

from engine.radix_cache import Node, RadixCache
from engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        assert num_blocks >= 1 and block_size >= 1
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def refcount(self, b: int) -> int:
        return self._refs[b]

    def allocate(self) -> int:
        if not self._free:
            raise MemoryError("no free KV blocks")
        b = self._free.pop()
        assert self._refs[b] == 0
        self._refs[b] = 1
        return b

    def incref(self, b: int) -> None:
        assert self._refs[b] > 0, f"incref of free block {b}"
        self._refs[b] += 1

    def decref(self, b: int) -> bool:
        """Drop one reference; True if that freed the block."""
        assert self._refs[b] > 0, f"decref of free block {b}"
        self._refs[b] -= 1
        if self._refs[b]:
            return False
        self._free.append(b)
        return True


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_cache: bool = True):
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.cache = RadixCache(block_size) if enable_prefix_cache else None
        self._seqs: dict[int, Sequence] = {}      # sequences holding blocks, by seq_id
        self._locks: dict[int, Node] = {}         # seq_id -> radix node it holds locked: its prefix in the cache

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    @property
    def num_available_blocks(self) -> int:
        """Free blocks plus cached blocks that eviction could free right now."""
        return self.allocator.num_free + (self.cache.evictable_blocks if self.cache else 0)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences or locked cache entries (not reclaimable)."""
        return 1.0 - self.num_available_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def allocate_prompt(self, seq: Sequence) -> bool:
        """Give seq blocks for all its known tokens, reusing the longest cached prefix (locked until
        free). Always leaves the last token to compute, since the model needs its logits.
        Returns False, changing nothing, if memory is short even after evicting the cache."""
        assert seq.seq_id not in self._seqs and not seq.block_table, "sequence already holds blocks"
        hit, node = self.cache.match_prefix(seq.all_ids[:-1], seq.cache_scope) if self.cache else ([], None)
        if node is not None:
            self.cache.lock(node)
        need = self.blocks_needed(seq.num_tokens) - len(hit)
        if need > self.num_available_blocks:
            if node is not None:
                self.cache.unlock(node)
            return False
        for b in hit:
            self.allocator.incref(b)
        seq.block_table = hit + self._allocate(need)
        seq.num_computed = seq.num_cached_prefix = len(hit) * self.block_size
        if not seq.output_ids:
            seq.num_cached_prompt = seq.num_cached_prefix
        self._seqs[seq.seq_id] = seq
        if node is not None:
            self._locks[seq.seq_id] = node
        return True

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self._blocks_to_append(seq, num_new_tokens) <= self.num_available_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]] | None:
        """Make positions [num_computed, num_computed + num_new_tokens) writable: add blocks at the end
        and replace shared blocks in that range by private copies. Returns the (src, dst) block copies
        the runner must do before writing, or None (changing nothing) if memory is short."""
        assert seq.seq_id in self._seqs, "append_slots on a sequence without blocks"
        if not self.can_append(seq, num_new_tokens):
            return None
        table, bs = seq.block_table, self.block_size
        end = seq.num_computed + num_new_tokens
        copies = []
        for i in self._shared_in_range(seq, end):
            dst = self._allocate(1)[0]
            copies.append((table[i], dst))
            self.allocator.decref(table[i])
            table[i] = dst
        table += self._allocate(cdiv(end, bs) - len(table))
        return copies

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Flat KV slot (block * block_size + offset) of each token position in [start, end)."""
        bs, table = self.block_size, seq.block_table
        assert 0 <= start <= end <= len(table) * bs, "positions outside the block table"
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let child share all of parent's blocks (parallel sampling); writes then copy on write."""
        assert parent.seq_id in self._seqs and child.seq_id not in self._seqs
        for b in parent.block_table:
            self.allocator.incref(b)
        child.block_table = list(parent.block_table)
        child.num_computed = parent.num_computed
        child.num_cached_prefix = parent.num_cached_prefix  # same locked prefix, so free() treats it alike
        child.num_cached_prompt = parent.num_cached_prompt
        self._seqs[child.seq_id] = child
        node = self._locks.get(parent.seq_id)
        if node is not None:
            self.cache.lock(node)
            self._locks[child.seq_id] = node

    def cache_computed(self, seq: Sequence) -> None:
        """Hand seq's full computed blocks to the radix cache while it still runs (SGLang's cache_unfinished_req),
        locked for it: a request with the same prefix admitted from the next step on shares them. Only a finished
        sequence's blocks were cached, so requests sharing a long system prompt each computed it while the first
        was still answering."""
        if self.cache is None:
            return
        n = self._cacheable_blocks(seq)
        if n * self.block_size <= self._in_cache(seq):
            return
        self._hand_over(seq, n)
        _, node = self.cache.match_prefix(seq.all_ids[:n * self.block_size], seq.cache_scope)
        self.cache.lock(node)
        if (held := self._locks.get(seq.seq_id)) is not None:
            self.cache.unlock(held)
        self._locks[seq.seq_id] = node

    def free(self, seq: Sequence, cache: bool = True) -> None:
        """Release seq's blocks; with cache, first hand its full computed blocks to the radix cache."""
        assert self._seqs.pop(seq.seq_id, None) is seq, "free of a sequence without blocks"
        if cache and self.cache is not None:
            self._hand_over(seq, self._cacheable_blocks(seq))
        node = self._locks.pop(seq.seq_id, None)  # after: the locked node says how much the cache holds already
        if node is not None:
            self.cache.unlock(node)
        for b in seq.block_table:
            self.allocator.decref(b)
        seq.block_table = []

    def release_rejected_blocks(self, seq: Sequence) -> int:
        """Roll back KV memory after speculative verification: free the blocks past those seq's known tokens
        need. They were appended this step for drafts that got rejected, so only seq holds them. Returns how
        many. Rejected K/V left inside a kept block sits past num_computed: never read, later overwritten."""
        keep = self.blocks_needed(seq.num_tokens)
        tail = seq.block_table[keep:]
        del seq.block_table[keep:]
        for b in tail:
            assert self.allocator.decref(b), f"rolled-back block {b} was shared"
        return len(tail)

    def evict(self, num_blocks: int) -> int:
        """Free up to num_blocks cached blocks (LRU); returns how many were freed."""
        if self.cache is None:
            return 0
        freed = [b for b in self.cache.evict(num_blocks) if self.allocator.decref(b)]
        return len(freed)

    def kv_waste(self) -> float:
        """Allocated-but-unused slots / allocated slots, over live sequences (internal fragmentation)."""
        allocated = sum(len(s.block_table) for s in self._seqs.values()) * self.block_size
        used = sum(min(s.num_tokens, len(s.block_table) * self.block_size) for s in self._seqs.values())
        return (allocated - used) / allocated if allocated else 0.0

    def check_integrity(self) -> None:
        """free + in-use + cached-only == total, and every refcount equals its number of holders."""
        holders = [0] * self.num_blocks
        for seq in self._seqs.values():
            for b in seq.block_table:
                holders[b] += 1
        in_use = sum(1 for h in holders if h)
        cached = self.cache.all_blocks() if self.cache else []
        for b in cached:
            holders[b] += 1
        cached_only = sum(1 for b in cached if holders[b] == 1)
        free = set(self.allocator._free)
        assert len(free) == self.num_free_blocks, "a block is on the free list twice"
        assert self.num_free_blocks + in_use + cached_only == self.num_blocks, "leaked blocks"
        for b in range(self.num_blocks):
            assert self.allocator.refcount(b) == holders[b], f"block {b}: refcount != holders"
            assert (b in free) == (holders[b] == 0)
        if self.cache is not None:
            self.cache.check_integrity()
            assert all(node.lock_ref > 0 for node in self._locks.values())
            unlocked = [b for n in self.cache.nodes() if n.lock_ref == 0 for b in n.blocks]
            assert all(holders[b] == 1 for b in unlocked), "an evictable block is still in use"

    # -- internals ---------------------------------------------------------------------------

    def _allocate(self, n: int) -> list[int]:
        """n fresh blocks, evicting cached ones first if the free list is short."""
        if n > self.allocator.num_free:
            self.evict(n - self.allocator.num_free)
        return [self.allocator.allocate() for _ in range(n)]

    def _shared_in_range(self, seq: Sequence, end: int) -> list[int]:
        """Block-table indices in the write range [num_computed, end) whose block others also hold."""
        bs, table = self.block_size, seq.block_table
        first, last = seq.num_computed // bs, min(cdiv(end, bs), len(table))
        return [i for i in range(first, last) if self.allocator.refcount(table[i]) > 1]

    def _blocks_to_append(self, seq: Sequence, num_new_tokens: int) -> int:
        end = seq.num_computed + num_new_tokens
        grow = max(0, cdiv(end, self.block_size) - len(seq.block_table))
        return grow + len(self._shared_in_range(seq, end))

    def _hand_over(self, seq: Sequence, n: int) -> None:
        """The radix cache takes seq's first n blocks, with a reference of its own to each it did not hold."""
        present = self.cache.insert(seq.all_ids, seq.block_table[:n], seq.cache_scope)
        for b in seq.block_table[present // self.block_size:n]:
            self.allocator.incref(b)

    def _in_cache(self, seq: Sequence) -> int:
        """Tokens of seq's prefix the cache holds for it (matched at admission, or handed over since): the depth of
        the node it holds locked."""
        node = self._locks.get(seq.seq_id)
        return 0 if node is None else self.cache.depth(node)

    def _cacheable_blocks(self, seq: Sequence) -> int:
        """Full computed blocks the cache may take: stop at the first block another sequence still
        shares (a fork's), so every unlocked cached block stays freeable by eviction."""
        full = seq.num_computed // self.block_size
        start = self._in_cache(seq) // self.block_size  # the locked prefix is the cache's already
        for i in range(start, full):
            if self.allocator.refcount(seq.block_table[i]) > 1:
                return i
        return full
