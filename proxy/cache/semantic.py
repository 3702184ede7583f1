"""Sentence embeddings (off the event loop, micro-batched) and one faiss index per semantic scope."""
from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import faiss
import numpy as np

from .encoders import MAX_BATCH, SentenceEncoder, default_model_path, load_encoder
from .verifier import Reading, agrees, read

_MEMO = 256  # recent (scope, text)s: the store after a miss reuses the vector its lookup computed
_HNSW_NEIGHBOURS = 32
_HNSW_EF_SEARCH = 64


def _embed_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, "velo-cache-embed", initializer=_one_torch_thread)


@dataclass(frozen=True)
class Embedded:
    """A text's vector and its reading for the verifier, made in one trip to the encoder's thread."""

    vector: np.ndarray
    reading: Reading
    whole: bool = True  # the vector saw all of the text (proxy/cache/encoders.py: reads_whole)


@dataclass
class Embedder:
    """Callers awaiting `embed` in the same loop turn share one trip to the worker thread, so a burst of
    lookups costs one hand-off and one encoder call, and the event loop only ever waits on a future. The same
    trip reads each text for the verifier (~50 us a question, against ~3 ms for its vector)."""

    model: SentenceEncoder
    dim: int
    _pool: ThreadPoolExecutor = field(default_factory=_embed_pool)
    _pending: list[tuple[str, asyncio.Future]] = field(default_factory=list)
    _worker: asyncio.Task | None = None
    _memo: OrderedDict[tuple[str, str], Embedded] = field(default_factory=OrderedDict)

    @classmethod
    async def load(cls, path: str | None = None, precision: str = "int8") -> "Embedder":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        pool = _embed_pool()  # loading there too: no other thread of ours gets an OpenMP team
        model = await asyncio.get_running_loop().run_in_executor(pool, load_encoder, path or default_model_path(),
                                                                 precision)
        return cls(model, model.dim, pool)

    async def embed(self, text: str, scope: str = "") -> Embedded:
        """`scope`: whose text it is (the API key's cache scope). The memo answers that scope only: shared, a key's
        semantic hit came back at once for a text another key had sent and after an encode for one nobody had
        (its prompt_eval_duration said which), so a key could test guesses of another's prompts."""
        memo = (scope, text)
        if memo in self._memo:
            self._memo.move_to_end(memo)
            return self._memo[memo]
        future = asyncio.get_running_loop().create_future()
        self._pending.append((text, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        embedded = await future
        if embedded.whole:  # a text too long to read whole is no vector: nothing to keep of it
            self._memo[memo] = embedded
            if len(self._memo) > _MEMO:
                self._memo.popitem(last=False)
        return embedded

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            try:
                done = await loop.run_in_executor(self._pool, self._embed_and_read, [text for text, _ in batch])
            except Exception as e:  # every waiter sees the failure; none hangs
                done = [e] * len(batch)
            for (_, future), v in zip(batch, done):
                if not future.done():
                    future.set_exception(v) if isinstance(v, Exception) else future.set_result(v)

    def _embed_and_read(self, texts: list[str]) -> list[Embedded]:
        """A text past the encoder's window is neither encoded nor read: the semantic tier leaves it to the exact
        one, and reading a 200 KB turn for the verifier took 9 s of this thread, which every lookup shares."""
        whole = [self.model.reads_whole(t) for t in texts]
        vectors = iter(self.encode([t for t, w in zip(texts, whole) if w]) if any(whole) else ())
        return [Embedded(next(vectors), read(t)) if w else Embedded(np.zeros(self.dim, np.float32), read(""), False)
                for t, w in zip(texts, whole)]

    def encode(self, texts: list[str]) -> np.ndarray:
        """Blocking: unit-length float32 rows, so inner product is cosine similarity."""
        return self.model.encode(texts)

    async def verify(self, query: Reading, texts: list[str]) -> list[bool]:
        """Whether each text may share the query's answer, read on the encoder's thread (texts from a shared
        tier arrive unread)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: [agrees(query, read(t)) for t in texts])

    async def close(self) -> None:
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)
        self._pool.shutdown(wait=True)


def _one_torch_thread() -> None:
    """Torch's OpenMP thread count is per calling thread: this worker encodes on one, the rest of the process
    keeps its own. A short sentence gains little from more, and where cores are shared (a backend, the engine,
    other processes) OpenMP threads spinning for a core made one encode 20x slower (712 vs 34 ms p50 measured
    on a busy 2-core machine). And a thread with more than one keeps a team of OpenMP workers, which slows
    every other thread's parallel ops in the process (engine/threads.py)."""
    import torch

    torch.set_num_threads(1)


@dataclass
class Entry:
    key: str  # the exact key whose payload answers this entry
    reading: Reading
    expires_at: float


@dataclass
class ScopeIndex:
    """Exact (flat) inner-product search over what came since the last graph; past `hnsw_above` entries, an HNSW
    graph over what the scope held when it was built. A graph is built off the event loop and never changed after,
    so searches go on while the next one is built: on the loop, building one over 2,049 vectors took 0.2 s, over
    50,000 22 s (the rebuild after a compaction), and each insert into it 3-94 ms, while every request waited."""

    dim: int
    hnsw_above: int
    max_entries: int
    vectors: list[np.ndarray] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    graph: Any = None  # HNSW over vectors[:graphed]
    graphed: int = 0
    recent: Any = None  # flat over vectors[graphed:]
    moves: int = 0  # compactions: a graph built before the last one no longer matches the entries' places
    building: bool = False

    def __post_init__(self) -> None:
        self.recent = _flat(self.dim, [])

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def is_hnsw(self) -> bool:
        return self.graph is not None

    @property
    def wants_graph(self) -> bool:
        """More than `hnsw_above` entries searched flat, and no graph being built."""
        return len(self.entries) - self.graphed > self.hnsw_above and not self.building

    def add(self, vector: np.ndarray, entry: Entry, now: float) -> None:
        if len(self.entries) >= self.max_entries:
            self._compact(now)
        self.vectors.append(vector)
        self.entries.append(entry)
        self.recent.add(vector.reshape(1, -1))

    async def build_graph(self, executor: Executor) -> None:
        """A graph over what the scope holds now, built on `executor`'s thread; searched once built, unless a
        compaction moved the entries meanwhile."""
        vectors, moves = list(self.vectors), self.moves
        self.building = True
        try:
            graph = await asyncio.get_running_loop().run_in_executor(executor, _hnsw, self.dim, vectors)
        finally:
            self.building = False
        if moves == self.moves:
            self.graph, self.graphed = graph, len(vectors)
            self.recent = _flat(self.dim, self.vectors[self.graphed:])

    def search(self, query: Embedded, threshold: float, now: float, k: int = 8) -> list[Entry]:
        """Entries at or above `threshold` that the verifier lets answer the query, best first. Both readings
        were made on the encoder's thread; comparing them is set arithmetic (~15 us a candidate, measured in
        bench/semantic_quality.py), run only on candidates above the threshold."""
        found: list[tuple[float, int]] = []
        for index, first in ((self.graph, 0), (self.recent, self.graphed)):
            if index is not None and index.ntotal:
                scores, ids = index.search(query.vector.reshape(1, -1), min(k, index.ntotal))
                found += [(float(s), first + int(i)) for s, i in zip(scores[0], ids[0]) if i >= 0]
        found.sort(reverse=True)
        return [entry for s, i in found[:k] if s >= threshold and (entry := self.entries[i]).expires_at > now
                and agrees(query.reading, entry.reading)]

    def _compact(self, now: float) -> None:
        """Drop expired entries, then the older half if still full: faiss HNSW cannot delete in place. What is
        kept is searched flat until a new graph is built."""
        keep = [i for i, e in enumerate(self.entries) if e.expires_at > now]
        keep = keep[-self.max_entries // 2:] if len(keep) >= self.max_entries else keep
        self.vectors = [self.vectors[i] for i in keep]
        self.entries = [self.entries[i] for i in keep]
        self.graph, self.graphed, self.moves = None, 0, self.moves + 1
        self.recent = _flat(self.dim, self.vectors)


def _flat(dim: int, vectors: list[np.ndarray]) -> Any:
    index = faiss.IndexFlatIP(dim)
    if vectors:
        index.add(np.stack(vectors))
    return index


def _hnsw(dim: int, vectors: list[np.ndarray]) -> Any:
    index = faiss.IndexHNSWFlat(dim, _HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efSearch = _HNSW_EF_SEARCH
    index.add(np.stack(vectors))
    return index
