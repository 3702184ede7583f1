"""Radix prefix cache: page-aligned match/insert, node splitting, locks, LRU eviction."""

import itertools

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.radix_cache import RadixCache

BS = 2


def fresh(counter, n):
    return [next(counter) for _ in range(n)]


def test_match_is_block_aligned_and_splits_partial_edges():
    cache = RadixCache(BS)
    assert cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12]) == 0
    blocks, node = cache.match_prefix([1, 2, 3, 4, 9, 9, 9])
    assert blocks == [10, 11]
    assert node.key == (1, 2, 3, 4) and [c.key for c in node.children.values()] == [(5, 6)]
    assert cache.match_prefix([1, 2, 3])[0] == [10]           # the unaligned tail is ignored
    assert cache.match_prefix([2, 2])[0] == []
    cache.check_integrity()


def test_insert_reports_present_tokens_and_adopts_only_the_rest():
    cache = RadixCache(BS)
    cache.insert([1, 2, 3, 4], [10, 11])
    assert cache.insert([1, 2, 3, 4, 5, 6, 7], [20, 21, 22]) == 4  # 7th token: no block for it
    assert cache.match_prefix([1, 2, 3, 4, 5, 6])[0] == [10, 11, 22]
    assert cache.cached_blocks == 3
    cache.check_integrity()


def test_evict_takes_lru_leaves_and_trims_tails():
    cache = RadixCache(BS)
    cache.insert([1, 1, 1, 1], [10, 11])
    cache.insert([2, 2, 2, 2], [20, 21])
    cache.match_prefix([1, 1, 1, 1])          # touch: [2, 2, ...] is now least recently used
    assert cache.evict(1) == [21]             # one block asked for: only the tail page goes
    assert cache.match_prefix([2, 2, 2, 2])[0] == [20]
    assert sorted(cache.evict(2)) == [10, 11]  # [1, 1, 1, 1] is now the least recently used
    assert cache.cached_blocks == 1
    cache.check_integrity()


def test_locked_path_survives_eviction_until_unlocked():
    cache = RadixCache(BS)
    cache.insert([1, 2, 3, 4], [10, 11])
    cache.insert([1, 2, 5, 6], [10, 12])
    _, node = cache.match_prefix([1, 2, 3, 4])
    cache.lock(node)
    assert cache.evictable_blocks == 1 and cache.protected_blocks == 2
    assert cache.evict(10) == [12]
    cache.unlock(node)
    assert sorted(cache.evict(10)) == [10, 11]
    assert cache.cached_blocks == 0
    cache.check_integrity()


def test_split_of_a_locked_edge_keeps_the_lock_on_the_path():
    cache = RadixCache(BS)
    cache.insert([1, 2, 3, 4], [10, 11])
    _, node = cache.match_prefix([1, 2, 3, 4])
    cache.lock(node)
    cache.match_prefix([1, 2, 9, 9])  # splits the locked edge
    assert cache.evict(10) == []
    cache.unlock(node)
    cache.check_integrity()
    assert cache.evictable_blocks == 2


def test_a_scope_never_matches_another_scopes_prefixes():
    """Another key's cached prefix served its prompt, and `cached_tokens` told a key how much of what it guessed
    another key had sent (the security audit read a memo back in 16-token steps)."""
    cache = RadixCache(BS)
    cache.insert([1, 2, 3, 4], [10, 11], scope="a")
    assert cache.match_prefix([1, 2, 3, 4], "b")[0] == [] and cache.match_prefix([1, 2, 3, 4])[0] == []
    assert cache.insert([1, 2, 3, 4, 5, 6], [20, 21, 22], scope="b") == 0  # b keeps its own copy
    assert cache.match_prefix([1, 2, 3, 4, 5, 6], "a")[0] == [10, 11]
    assert cache.match_prefix([1, 2, 9, 9], "b")[0] == [20]  # splits b's edge, not a's
    assert sorted(cache.evict(10)) == [10, 11, 20, 21, 22]
    cache.check_integrity()


tokens_st = st.lists(st.integers(0, 2), max_size=10)
scope_st = st.sampled_from(["", "a", "b"])


class RadixMachine(RuleBasedStateMachine):
    """Random insert/match/lock/unlock/evict against a model mapping each block to its token prefix."""

    def __init__(self):
        super().__init__()
        self.cache = RadixCache(BS)
        self.ids = itertools.count()
        self.prefix_of: dict[int, tuple[str, tuple[int, ...]]] = {}  # cached block -> scope, tokens to its page end
        self.locked: list[tuple[object, list[int]]] = []

    def check_match(self, tokens, blocks, scope):
        for i, b in enumerate(blocks):  # a true prefix of the same scope: every block holds exactly these tokens
            assert self.prefix_of[b] == (scope, tuple(tokens[:(i + 1) * BS]))
        longer = [p for s, p in self.prefix_of.values()
                  if s == scope and len(p) > len(blocks) * BS and tuple(tokens[:len(p)]) == p]
        assert not longer, "match missed a longer cached prefix"

    @rule(tokens=tokens_st, scope=scope_st)
    def insert(self, tokens, scope):
        blocks = fresh(self.ids, len(tokens) // BS)
        before, _ = self.cache.match_prefix(tokens, scope)
        present = self.cache.insert(tokens, blocks, scope)
        assert present == len(before) * BS
        for i in range(present // BS, len(blocks)):
            self.prefix_of[blocks[i]] = (scope, tuple(tokens[:(i + 1) * BS]))

    @rule(tokens=tokens_st, scope=scope_st)
    def match(self, tokens, scope):
        blocks, _ = self.cache.match_prefix(tokens, scope)
        self.check_match(tokens, blocks, scope)

    @rule(tokens=tokens_st, scope=scope_st)
    def lock(self, tokens, scope):
        blocks, node = self.cache.match_prefix(tokens, scope)
        self.cache.lock(node)
        self.locked.append((node, blocks))

    @precondition(lambda self: self.locked)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        node, _ = self.locked.pop(i % len(self.locked))
        self.cache.unlock(node)

    @rule(n=st.integers(0, 8))
    def evict(self, n):
        evictable = self.cache.evictable_blocks
        freed = self.cache.evict(n)
        assert len(freed) == min(n, evictable)
        protected = {b for _, blocks in self.locked for b in blocks}
        assert not protected & set(freed), "evicted a locked block"
        for b in freed:
            del self.prefix_of[b]

    @invariant()
    def consistent(self):
        self.cache.check_integrity()
        assert sorted(self.cache.all_blocks()) == sorted(self.prefix_of)


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
