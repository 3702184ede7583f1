"""The cache facade the proxy calls: exact tiers (memory -> SQLite -> Redis), then the semantic tier."""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Awaitable, Callable, Literal

from adapters.protocol import Chunk

from .codec import UnreadableEntry, decode_chunks, encode_chunks
from .config import CacheConfig
from .keys import Request, digest, exact_key, semantic_query
from .memory import MemoryLRU
from .policy import Policy, complete_stream
from .semantic import Embedded, Embedder, Entry, ScopeIndex
from .stats import CacheStats

log = logging.getLogger(__name__)
# A slower tier answers in about a millisecond; one that hangs (a table locked by a migration, a server stopped behind
# an open socket) held every cacheable request before its backend call and after its answer: 5 s each way on Redis
# (its client's socket timeout), without end on PostgreSQL. Past this it costs a miss, or an entry it does not keep.
TIER_TIMEOUT_S = 1.0
# ... and a tier that failed is not asked again for this long: a hung one cost every cacheable request that second
# twice (lookup and store) and logged a traceback each time
TIER_RETRY_S = 5.0
FAILED = object()  # what a slower tier's call gives that failed or was not made


async def within_tier_timeout(call: Awaitable[Any], unwinding: set[asyncio.Task]) -> Any:
    """`call`'s result, or TimeoutError once TIER_TIMEOUT_S has passed, without waiting for it to unwind: psycopg,
    cancelled, waits up to 5 s for the server to end the query, which a hung server never does, so a lookup took
    6.0 s, not 1. The call is cancelled in the background, held in `unwinding` until it ends, its error heard."""
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait([task], timeout=TIER_TIMEOUT_S)
    finally:
        if not task.done():
            task.cancel()
            unwinding.add(task)
            task.add_done_callback(lambda task: (unwinding.discard(task), task.cancelled() or task.exception()))
    if not done:
        raise TimeoutError(f"no answer within {TIER_TIMEOUT_S:g}s")
    return task.result()


@dataclass
class TierCalls:
    """Calls to the slower tiers (SQLite, Redis, PostgreSQL) of the cache or of the stored responses, each within
    TIER_TIMEOUT_S: a tier down or hung costs a miss (or an entry not kept), never the request; after a failure it is
    left alone for TIER_RETRY_S."""

    log: logging.Logger
    whose: str  # the log's words for the tiers' owner ("cache tier", "stored responses:")
    resting: dict[str, float] = field(default_factory=dict)  # a tier that failed -> when it is asked again
    unwinding: set[asyncio.Task] = field(default_factory=set)  # calls past TIER_TIMEOUT_S, being cancelled

    async def __call__(self, name: str, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """`call()`'s result, or FAILED where the tier failed, took too long or is resting."""
        if time.monotonic() < self.resting.get(name, 0.0):
            return FAILED
        try:
            return await within_tier_timeout(call(), self.unwinding)
        except Exception:
            self.log.exception("%s %s failed on %s; not asked again for %gs", self.whose, name, what, TIER_RETRY_S)
            self.resting[name] = time.monotonic() + TIER_RETRY_S
            return FAILED


@dataclass
class CacheHit:
    kind: Literal["exact", "semantic"]
    chunks: list[Chunk]  # shared with the cache: replay them, do not mutate them


@dataclass
class Asked:
    """A request as the layer reads it, worked out once: a miss's lookup, skip reason and store share its key (the
    canonical form and its hash: 108 µs for a 13-turn agent chat, bench/cache_keys.py) and its semantic query, which
    each of them used to compute again."""
    req: Request
    scope: str  # the caller's: entries are never shared between API keys
    policy: Policy
    label: str  # the counters' model label
    encoder: str = ""  # the semantic tier's: a shared tier may hold vectors of other encoders, not comparable

    @cached_property
    def key(self) -> str:
        return exact_key(self.req, self.scope)

    @cached_property
    def skip_reason(self) -> str:
        """Why it is never answered from the cache, or "" when it may be (X-Velo-Cache-Reason)."""
        return self.policy.why_not(self.req)

    def work_out(self) -> None:
        """Its skip reason, and where it may be answered from the cache its key and semantic query, worked out now:
        a large request's on a thread (proxy/stages/cache.py), as each reads the whole request. Kept as the
        properties keep them, not through them: a cached_property computes under one lock for every instance
        (Python 3.11), and the event loop waited on it for another request's key."""
        kept = vars(self)
        kept["skip_reason"] = Asked.skip_reason.func(self)
        if self.skip_reason:
            return
        kept["key"] = Asked.key.func(self)
        if self.policy.semantic and self.encoder:  # an encoder: the layer has an embedder (`asked`)
            kept["semantic"] = Asked.semantic.func(self)

    @cached_property
    def semantic(self) -> tuple[str, str] | None:
        """The text to embed and its semantic scope (the exact scope, the earlier turns and the encoder), or None
        when the request is exact-only."""
        if (query := semantic_query(self.req)) is None:
            return None
        text, context = query
        return text, digest([self.scope, context, self.encoder])


@dataclass
class CacheLayer:
    cfg: CacheConfig
    memory: MemoryLRU
    stores: list[Any] = field(default_factory=list)  # SqliteStore / RedisStore, nearest first
    embedder: Embedder | None = None
    pg: Any = None  # PgVectorStore
    clock: Callable[[], float] = time.time
    owns_embedder: bool = False  # an embedder passed in is shared with others and closed by its owner
    indexes: OrderedDict[str, ScopeIndex] = field(default_factory=OrderedDict)  # least recently used first
    graphs: ThreadPoolExecutor | None = None  # builds the scopes' HNSW graphs, one at a time (2 shared cores)
    building: set[asyncio.Task] = field(default_factory=set)
    semantic_entries: int = 0
    counters: CacheStats = field(default_factory=CacheStats)
    tier_calls: TierCalls = field(default_factory=lambda: TierCalls(log, "cache tier"))

    @classmethod
    async def create(cls, cfg: CacheConfig, clock: Callable[[], float] = time.time,
                     embedder: Embedder | None = None) -> "CacheLayer":
        """`embedder` lets several layers (tests, benchmarks) share one loaded model."""
        layer = cls(cfg, MemoryLRU(cfg.max_bytes, clock), clock=clock)
        if cfg.sqlite_path:
            from .sqlite_store import SqliteStore
            layer.stores.append(await SqliteStore.open(cfg.sqlite_path, cfg.sqlite_max_bytes, clock))
        if cfg.redis_url:
            from .redis_store import RedisStore
            layer.stores.append(await RedisStore.open(cfg.redis_url))
        if cfg.semantic or any(r.semantic for r in cfg.routes):
            layer.owns_embedder = embedder is None
            layer.embedder = embedder or await Embedder.load(cfg.embed_model_path, cfg.embed_precision)
            layer.graphs = ThreadPoolExecutor(1, "velo-cache-graph")
            if cfg.pg_dsn:
                from .pgvector_store import PgVectorStore
                layer.pg = await PgVectorStore.open(cfg.pg_dsn, layer.embedder.dim)
        return layer

    async def close(self) -> None:
        for task in self.building:
            task.cancel()
        await asyncio.gather(*self.building, return_exceptions=True)
        if self.graphs is not None:
            self.graphs.shutdown(wait=False, cancel_futures=True)  # a graph half built is of no use
        for store in self.stores:
            await store.close()
        if self.pg is not None:
            await self.pg.close()
        if self.embedder is not None and self.owns_embedder:
            await self.embedder.close()

    def _policy(self, model: str) -> Policy:
        base = Policy(self.cfg.enabled, self.cfg.semantic, self.cfg.cache_nondeterministic, self.cfg.ttl_s)
        return base.with_route(self.cfg.routes, model)

    def asked(self, req: Request, scope: str, model: str | None = None, label: str | None = None) -> Asked:
        """`model` (the name asked) picks the `[[cache.routes]]` policy; `label` (router.py: bounded) keys the
        counters, which /metrics shows."""
        encoder = self.embedder.model.name if self.embedder is not None else ""
        return Asked(req, scope, self._policy(model or req.model), label or model or req.model, encoder)

    async def lookup(self, asked: Asked, bypass: bool = False) -> CacheHit | None:
        if bypass or asked.skip_reason:
            self.counters.count("all", asked.label, "bypass" if bypass else "skip")
            return None
        start = time.perf_counter()
        hit = await self._lookup_exact(asked.key, asked.label)
        if hit is None and asked.policy.semantic and self.embedder is not None:
            hit = await self._lookup_semantic(asked)
        kind = hit.kind if hit else "miss"
        self.counters.count("all", asked.label, "hit" if hit else "miss")
        self.counters.observe(kind, time.perf_counter() - start)
        return hit

    async def _lookup_exact(self, key: str, label: str) -> CacheHit | None:
        chunks = self.memory.get(key)
        self.counters.count("memory", label, "miss" if chunks is None else "hit")
        if chunks is None:
            chunks = await self._load(key, label)
        return CacheHit("exact", list(chunks)) if chunks is not None else None

    async def _load(self, key: str, label: str) -> list[Chunk] | None:
        """Try the slower tiers in order; a hit is copied into memory with the expiry it was stored with."""
        for store in self.stores:
            found = await self._tier(store.name, "get", label, lambda store=store: store.get(key))
            if found is FAILED:
                continue
            if found is not None:
                payload, expires_at = found
                chunks = self._read(payload, store.name, label)
                if chunks is not None:
                    self.memory.put_encoded(key, chunks, len(payload), expires_at - self.clock())
                    return chunks
            else:
                self.counters.count(store.name, label, "miss")
        return None

    def _read(self, payload: bytes, tier: str, label: str) -> list[Chunk] | None:
        """The answer a tier found, counted as its hit; None for one this Velo cannot read, counted as its error:
        the request that looked it up failed with a 500 (the answer is stored anew over it)."""
        try:
            chunks = decode_chunks(payload)
        except UnreadableEntry as e:
            log.warning("an entry in the %s tier that this Velo cannot read (another version's, or damaged) is a "
                        "miss: %s", tier, e)
            self.counters.count(tier, label, "error")
            return None
        self.counters.count(tier, label, "hit")
        return chunks

    async def _lookup_semantic(self, asked: Asked) -> CacheHit | None:
        if asked.semantic is None:
            return None
        (text, sid), label = asked.semantic, asked.label
        index = self.indexes.get(sid)
        if index is None and self.pg is None:  # nothing stored in this scope: skip the embedding
            self.counters.count("semantic", label, "miss")
            return None
        query = await self._embed(text, asked.scope, label)
        if query is None:
            return None
        now = self.clock()
        for entry in index.search(query, self.cfg.semantic_threshold, now) if index else []:
            chunks = self.memory.get(entry.key) or await self._load(entry.key, label)
            if chunks is not None:
                self.indexes.move_to_end(sid)
                self.counters.count("semantic", label, "hit")
                return CacheHit("semantic", list(chunks))
        self.counters.count("semantic", label, "miss")
        if self.pg is not None:
            return await self._lookup_pg(sid, query, label)
        return None

    async def _embed(self, text: str, scope: str, label: str) -> Embedded | None:
        """The text's vector, or None when the model fails (the semantic tier then costs a miss, never the
        request: a store runs after the answer has been streamed) or did not read all of the text: then the text
        is left to the exact tier (the same pasted page followed by "summarize it" and by "list its typos" had one
        vector, and the guard lets a changed instruction of several words through)."""
        try:
            embedded = await self.embedder.embed(text, scope)
        except Exception:
            log.exception("cache embedding failed")
            self.counters.count("semantic", label, "error")
            return None
        if not embedded.whole:
            self.counters.count("semantic", label, "skip")
            return None
        return embedded

    async def _lookup_pg(self, sid: str, query: Embedded, label: str) -> CacheHit | None:
        payload = await self._tier("pgvector", "search", label, lambda: self.pg.search(
            sid, query, self.cfg.semantic_threshold, self.embedder.verify))
        if payload is FAILED:
            return None
        if payload is None:
            self.counters.count("pgvector", label, "miss")
            return None
        chunks = self._read(payload, "pgvector", label)
        return CacheHit("semantic", chunks) if chunks is not None else None

    async def store(self, asked: Asked, chunks: list[Chunk]) -> bool:
        """Write a finished answer to every tier. Errors, cancels, cut-off streams (by the context window too) and
        sampled requests are refused (False)."""
        policy, label = asked.policy, asked.label
        if asked.skip_reason or not complete_stream(chunks, asked.req.options.max_tokens):
            self.counters.count("all", label, "skip")
            return False
        key, payload = asked.key, encode_chunks(chunks)
        expires_at = self.clock() + policy.ttl_s
        self.memory.put_encoded(key, decode_chunks(payload), len(payload), policy.ttl_s)
        await asyncio.gather(*(self._put(store, key, payload, expires_at, label) for store in self.stores))
        if policy.semantic and self.embedder is not None and not _carries_prompt(chunks):
            await self._store_semantic(asked, payload, expires_at)
        self.counters.count("all", label, "store")
        return True

    async def _put(self, store: Any, key: str, payload: bytes, expires_at: float, label: str) -> None:
        await self._tier(store.name, "put", label, lambda: store.put(key, payload, expires_at))

    async def _tier(self, name: str, what: str, label: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """One call to a slower tier (TierCalls), its failure counted."""
        found = await self.tier_calls(name, what, call)
        if found is FAILED:
            self.counters.count(name, label, "error")
        return found

    async def _store_semantic(self, asked: Asked, payload: bytes, expires_at: float) -> None:
        if asked.semantic is None:
            return
        (text, sid), label = asked.semantic, asked.label
        embedded = await self._embed(text, asked.scope, label)
        if embedded is None:
            return
        index = self.indexes.get(sid)
        if index is None:
            index = self.indexes[sid] = ScopeIndex(self.embedder.dim, self.cfg.hnsw_above,
                                                   self.cfg.semantic_max_entries)
        self.indexes.move_to_end(sid)
        before = len(index)
        index.add(embedded.vector, Entry(asked.key, embedded.reading, expires_at), self.clock())
        self.semantic_entries += len(index) - before
        if index.wants_graph and self.graphs is not None:
            task = asyncio.create_task(self._build_graph(index, self.graphs))
            self.building.add(task)
            task.add_done_callback(self.building.discard)
        self._evict_scopes()
        if self.pg is not None:
            await self._tier("pgvector", "add", label, lambda: self.pg.add(sid, embedded.vector, text, payload,
                                                                             expires_at))

    @staticmethod
    async def _build_graph(index: ScopeIndex, graphs: ThreadPoolExecutor) -> None:
        """In the background: lookups go on searching the scope meanwhile."""
        try:
            await index.build_graph(graphs)
        except Exception:  # faiss out of memory, say: the scope stays searched flat
            log.exception("cache: building a semantic scope's HNSW graph failed")

    def _evict_scopes(self) -> None:
        """Conversations come and go: past `semantic_max_entries` in all, the least recently used scopes go."""
        while self.semantic_entries > self.cfg.semantic_max_entries and len(self.indexes) > 1:
            _, index = self.indexes.popitem(last=False)
            self.semantic_entries -= len(index)

    def stats(self) -> dict:
        used = {"memory": self.memory.bytes_used, "memory_entries": len(self.memory),
                **{s.name: s.bytes_used for s in self.stores if hasattr(s, "bytes_used")},
                "semantic_entries": self.semantic_entries, "semantic_scopes": len(self.indexes)}
        return self.counters.snapshot(used)


def _carries_prompt(chunks: list[Chunk]) -> bool:
    """Whether the answer holds its own prompt: Ollama's `context` (a generate's prompt and answer as token ids, which
    the client sends back as its next turn's start). It answers that prompt alone: served on a semantic hit, the
    client went on from another question's words."""
    return any(c.context for c in chunks)
