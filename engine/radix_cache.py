"""A token radix tree over KV blocks (SGLang's radix cache, page-aligned as in mini-sglang).

Every edge holds a whole number of pages (block_size tokens each) and one block id per page, so a
matched prefix maps straight onto a block table. The tree never frees memory: `evict` returns the
block ids it dropped and the block manager, which owns refcounts and the free list, releases them.

Prefixes are kept per scope (an API key's, as vLLM's `cache_salt` does): the root's children are found by scope
and first page, so a request never reuses another scope's KV, and the length of its cached prefix (what
`cached_tokens` reports, and how soon it answers) tells it nothing of what another key sent.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    key: tuple[int, ...] = ()                  # tokens on the edge from the parent; len % block_size == 0
    blocks: list[int] = field(default_factory=list)  # one block id per page of `key`
    parent: Node | None = None
    children: dict[tuple, Node] = field(default_factory=dict)  # first page (and scope, under the root) -> child
    scope: str = ""                            # whose prefixes these are
    lock_ref: int = 0                          # live sequences using this node (or a descendant)
    last_access: int = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixCache:
    def __init__(self, block_size: int):
        assert block_size >= 1
        self.block_size = block_size
        self.root = Node()
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_blocks = 0   # blocks in unlocked nodes
        self.protected_blocks = 0   # blocks in locked nodes
        self._clock = itertools.count(1)

    @property
    def cached_blocks(self) -> int:
        return self.evictable_blocks + self.protected_blocks

    def match_prefix(self, tokens: list[int], scope: str = "") -> tuple[list[int], Node]:
        """Block ids of the longest block-aligned prefix of `tokens` that `scope` has cached, and the node where it
        ends."""
        node, blocks, _ = self._walk(tokens, scope)
        return blocks, node

    def insert(self, tokens: list[int], blocks: list[int], scope: str = "") -> int:
        """Cache `blocks` as the KV of tokens[:len(blocks) * block_size].

        Returns how many tokens were already present: the cache adopts only blocks[present // bs:],
        the caller keeps responsibility for the others (they are duplicates of cached blocks).
        """
        n = len(blocks) * self.block_size
        assert len(tokens) >= n, "fewer tokens than blocks cover"
        key = tokens[:n]
        node, _, present = self._walk(key, scope)
        if present < n:
            leaf = Node(tuple(key[present:]), list(blocks[present // self.block_size:]), node,
                        last_access=next(self._clock), scope=scope)
            node.children[self._slot(node, leaf.key, scope)] = leaf
            self.evictable_blocks += len(leaf.blocks)
        return present

    def depth(self, node: Node) -> int:
        """Tokens from the root to the end of node's edge (a split keeps it: the upper part takes the lower's place)."""
        tokens = 0
        while node is not self.root:
            tokens += len(node.key)
            node = node.parent
        return tokens

    def lock(self, node: Node) -> None:
        """Protect node and its ancestors from eviction while a sequence reads their blocks."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_blocks -= len(node.blocks)
                self.protected_blocks += len(node.blocks)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            assert node.lock_ref > 0, "unlock without lock"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_blocks += len(node.blocks)
                self.protected_blocks -= len(node.blocks)
            node = node.parent

    def evict(self, num_blocks: int) -> list[int]:
        """Drop up to num_blocks blocks, least recently used unlocked leaves first (trimming a leaf's
        tail pages when fewer are needed). Returns the dropped block ids; freeing them is the caller's job."""
        heap = [(n.last_access, id(n), n) for n in self.nodes() if n.is_leaf and n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_blocks:
            _, _, leaf = heapq.heappop(heap)
            take = min(len(leaf.blocks), num_blocks - len(freed))
            freed += leaf.blocks[len(leaf.blocks) - take:]
            self.evictable_blocks -= take
            if take < len(leaf.blocks):
                del leaf.blocks[len(leaf.blocks) - take:]
                leaf.key = leaf.key[:len(leaf.blocks) * self.block_size]
                continue
            parent = leaf.parent
            del parent.children[self._slot(parent, leaf.key, leaf.scope)]
            if parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def nodes(self) -> Iterator[Node]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def all_blocks(self) -> list[int]:
        return [b for n in self.nodes() for b in n.blocks]

    def check_integrity(self) -> None:
        """Tree shape, page alignment, lock counts and size counters agree."""
        evictable = protected = 0
        for node in self.nodes():
            if node is self.root:
                continue
            assert node.key and len(node.key) == len(node.blocks) * self.block_size
            assert node.parent.children.get(self._slot(node.parent, node.key, node.scope)) is node
            assert node.scope == node.parent.scope or node.parent is self.root
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values())
            assert node.lock_ref >= 0
            if node.lock_ref:
                protected += len(node.blocks)
            else:
                evictable += len(node.blocks)
        assert (evictable, protected) == (self.evictable_blocks, self.protected_blocks)
        blocks = self.all_blocks()
        assert len(blocks) == len(set(blocks)), "a block is cached twice"

    # -- internals ---------------------------------------------------------------------------

    def _slot(self, parent: Node, key, scope: str) -> tuple:
        """Where a child whose edge starts with `key` hangs under `parent`: by its first page, and under the root by
        its scope too."""
        page = tuple(key[:self.block_size])
        return (scope, *page) if parent is self.root else page

    def _walk(self, tokens: list[int], scope: str) -> tuple[Node, list[int], int]:
        """Follow tokens (rounded down to whole pages) from the root, splitting an edge that matches
        only partly so the match always ends on a node. Returns (node, block ids, matched tokens)."""
        bs = self.block_size
        key = tokens[:len(tokens) // bs * bs]
        node, blocks, pos = self.root, [], 0
        now = next(self._clock)
        while pos < len(key):
            child = node.children.get(self._slot(node, key[pos:pos + bs], scope))
            if child is None:
                break
            n = self._common_pages(child.key, key, pos)
            if n * bs < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            blocks += child.blocks
            pos += len(child.key)
            node = child
        return node, blocks, pos

    def _common_pages(self, edge: tuple[int, ...], key: list[int], pos: int) -> int:
        bs, n = self.block_size, 1  # the first page matched through the children dict
        while n * bs < len(edge) and pos + (n + 1) * bs <= len(key) \
                and edge[n * bs:(n + 1) * bs] == tuple(key[pos + n * bs:pos + (n + 1) * bs]):
            n += 1
        return n

    def _split(self, child: Node, pages: int) -> Node:
        """Cut child's edge after `pages` pages; the new upper node inherits the lock count."""
        cut = pages * self.block_size
        upper = Node(child.key[:cut], child.blocks[:pages], child.parent,
                     lock_ref=child.lock_ref, last_access=child.last_access, scope=child.scope)
        child.parent.children[self._slot(child.parent, upper.key, upper.scope)] = upper
        child.key, child.blocks, child.parent = child.key[cut:], child.blocks[pages:], upper
        upper.children[self._slot(upper, child.key, child.scope)] = child
        return upper
