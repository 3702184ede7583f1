"""Block allocator and block manager: refcounts, prefix reuse, copy-on-write, slot mapping, draft rollback."""

import pytest

from engine.kv_cache import BlockAllocator, BlockManager
from engine.sequence import Sequence, SequenceStatus

BS = 4


def seq(seq_id, prompt, max_tokens=8):
    return Sequence(seq_id, list(prompt), max_tokens)


def finish_prefill(bm, s):
    """Pretend the runner computed every known token (the next sampled one is not appended yet)."""
    assert bm.append_slots(s, s.num_tokens - s.num_computed) == []
    s.num_computed = s.num_tokens


def test_allocator_refcounts_and_free_list():
    alloc = BlockAllocator(3, BS)
    a, b = alloc.allocate(), alloc.allocate()
    assert (a, b, alloc.num_free) == (0, 1, 1)
    alloc.incref(a)
    assert alloc.refcount(a) == 2 and alloc.decref(a) is False and alloc.decref(a) is True
    assert alloc.num_free == 2
    alloc.allocate(), alloc.allocate()
    with pytest.raises(MemoryError):
        alloc.allocate()
    with pytest.raises(AssertionError):
        BlockAllocator(1, BS).decref(0)


def test_allocate_prompt_reserves_every_known_token_and_maps_slots():
    bm = BlockManager(8, BS)
    s = seq(1, range(10))
    assert bm.allocate_prompt(s)
    assert len(s.block_table) == 3 and s.num_computed == 0 and bm.num_free_blocks == 5
    b0, b1, b2 = s.block_table
    assert bm.slot_mapping(s, 3, 6) == [b0 * BS + 3, b1 * BS, b1 * BS + 1]
    assert bm.slot_mapping(s, 9, 10) == [b2 * BS + 1]
    assert bm.kv_waste() == pytest.approx(2 / 12)
    bm.check_integrity()


def test_prefix_hit_reuses_full_blocks_and_leaves_the_last_token():
    bm = BlockManager(16, BS)
    first = seq(1, range(12))
    bm.allocate_prompt(first)
    finish_prefill(bm, first)
    first_blocks = first.block_table
    bm.free(first)                                    # caches its 3 full blocks
    assert bm.cache.cached_blocks == 3
    again = seq(2, range(12))                         # whole prompt cached: still compute token 11
    assert bm.allocate_prompt(again)
    assert again.num_computed == again.num_cached_prefix == 8
    assert again.block_table[:2] == first_blocks[:2]
    longer = seq(3, list(range(12)) + [99, 98])
    assert bm.allocate_prompt(longer) and longer.num_cached_prefix == 12
    assert longer.block_table[:2] == again.block_table[:2]
    assert bm.allocator.refcount(longer.block_table[0]) == 3  # cache + two sequences
    bm.check_integrity()
    assert bm.cache.evictable_blocks == 0 and bm.evict(10) == 0  # every cached block is being read
    bm.free(longer)
    assert bm.evict(10) == 1                          # block 2; `again` still reads blocks 0-1
    bm.check_integrity()


def test_failed_allocation_changes_nothing():
    bm = BlockManager(4, BS)
    big = seq(1, range(12))
    assert bm.allocate_prompt(big)
    finish_prefill(bm, big)
    bm.free(big)
    other = seq(2, [7] * 20)                          # 5 blocks > 4 in total
    before = (bm.num_free_blocks, bm.cache.cached_blocks, bm.cache.evictable_blocks)
    assert not bm.allocate_prompt(other)
    assert (bm.num_free_blocks, bm.cache.cached_blocks, bm.cache.evictable_blocks) == before
    assert other.block_table == [] and other.num_computed == 0
    bm.check_integrity()


def test_allocation_evicts_the_cache_on_demand():
    bm = BlockManager(4, BS)
    old = seq(1, range(16))
    bm.allocate_prompt(old)
    finish_prefill(bm, old)
    bm.free(old)
    assert bm.num_free_blocks == 0 and bm.num_available_blocks == 4
    new = seq(2, [50] * 6)
    assert bm.allocate_prompt(new) and bm.cache.cached_blocks == 2
    bm.check_integrity()


def test_append_slots_grows_at_block_boundaries():
    bm = BlockManager(4, BS)
    s = seq(1, range(4))
    bm.allocate_prompt(s)
    finish_prefill(bm, s)
    s.output_ids.append(5)
    assert bm.can_append(s, 1) and bm.append_slots(s, 1) == [] and len(s.block_table) == 2
    s.num_computed += 1
    assert bm.append_slots(s, 3) == [] and len(s.block_table) == 2  # positions 5..7 fit
    assert not bm.can_append(s, 12) and bm.append_slots(s, 12) is None
    assert len(s.block_table) == 2
    bm.check_integrity()


def test_fork_shares_blocks_and_copies_on_write():
    bm = BlockManager(8, BS)
    parent = seq(1, range(6))
    bm.allocate_prompt(parent)
    finish_prefill(bm, parent)
    parent.output_ids.append(40)                      # position 6 is pending, in shared block 1
    child = seq(2, range(6))
    child.output_ids.append(41)
    bm.fork(parent, child)
    shared = parent.block_table[1]
    assert bm.allocator.refcount(shared) == 2
    copies = bm.append_slots(child, 1)
    assert len(copies) == 1 and copies[0][0] == shared and child.block_table[1] == copies[0][1]
    assert child.block_table[0] == parent.block_table[0]   # untouched full block stays shared
    assert bm.append_slots(parent, 1) == []                 # now the only holder: write in place
    bm.check_integrity()
    child.num_computed += 1
    bm.free(child)                                    # block 0 still shared with parent: not cached
    assert bm.cache.cached_blocks == 0
    bm.free(parent)
    assert bm.cache.cached_blocks == 1
    bm.check_integrity()


def test_free_caches_only_full_computed_blocks():
    bm = BlockManager(8, BS)
    s = seq(1, range(10))
    bm.allocate_prompt(s)
    s.num_computed = 7                                # e.g. aborted mid-prefill
    bm.free(s)
    assert bm.cache.cached_blocks == 1 and bm.num_free_blocks == 7
    bm.check_integrity()
    nocache = BlockManager(8, BS, enable_prefix_cache=False)
    t = seq(2, range(10))
    nocache.allocate_prompt(t)
    t.num_computed = 10
    nocache.free(t)
    assert nocache.num_free_blocks == 8 and nocache.evict(8) == 0
    nocache.check_integrity()


def test_integrity_check_catches_a_leak():
    bm = BlockManager(4, BS)
    bm.allocator.allocate()                           # a block no one holds
    with pytest.raises(AssertionError):
        bm.check_integrity()


# -- rollback of rejected speculative drafts -------------------------------------------------

def _decoding_sequence(blocks: BlockManager, prompt_len: int) -> Sequence:
    seq = Sequence(1, list(range(prompt_len)), 64)
    assert blocks.allocate_prompt(seq)
    seq.status = SequenceStatus.RUNNING
    blocks.append_slots(seq, seq.num_uncomputed)
    seq.num_computed = seq.num_tokens
    seq.output_ids.append(100)
    return seq


@pytest.mark.parametrize("kept", [0, 1, 5, 9])
def test_rollback_frees_exactly_the_blocks_of_rejected_drafts(kept):
    blocks = BlockManager(num_blocks=16, block_size=4)
    seq = _decoding_sequence(blocks, prompt_len=6)  # 7 tokens, position 6 pending
    free_before = blocks.num_free_blocks
    k = 9
    assert blocks.append_slots(seq, 1 + k) == []     # pending token + 9 drafts: positions 6..15
    assert len(seq.block_table) == 4
    start = seq.num_computed
    seq.output_ids += [200 + i for i in range(kept)] + [300]  # kept drafts and the target's token
    seq.num_computed = start + 1 + kept
    released = blocks.release_rejected_blocks(seq)
    assert len(seq.block_table) == min(4, blocks.blocks_needed(seq.num_tokens))  # never grows
    assert released == 4 - len(seq.block_table)
    assert blocks.num_free_blocks == free_before - (len(seq.block_table) - 2)
    blocks.check_integrity()
    blocks.free(seq)
    blocks.check_integrity()
    assert blocks.num_available_blocks == blocks.num_blocks


def test_rollback_keeps_blocks_shared_with_the_prefix_cache():
    blocks = BlockManager(num_blocks=16, block_size=4)
    first = _decoding_sequence(blocks, prompt_len=9)
    blocks.free(first)  # caches two full blocks
    seq = Sequence(2, list(range(9)) + [100], 64)
    assert blocks.allocate_prompt(seq) and seq.num_cached_prefix == 8
    seq.status = SequenceStatus.RUNNING
    blocks.append_slots(seq, seq.num_uncomputed)
    seq.num_computed = seq.num_tokens
    seq.output_ids.append(7)
    blocks.append_slots(seq, 1 + 6)
    seq.output_ids.append(8)  # every draft rejected
    seq.num_computed += 1
    blocks.release_rejected_blocks(seq)
    assert len(seq.block_table) == 3
    blocks.check_integrity()
