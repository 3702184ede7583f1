"""Shared semantic tier: PostgreSQL + pgvector, so Velo processes share semantic entries as Redis shares exact
ones. Each row carries its answer and its text; the texts above the threshold are read and verified as the
local index's are (guard and verifier.py), so a shared hit is held to the same standard as a local one."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from psycopg import AsyncConnection, AsyncCursor

from .verifier import Reading

if TYPE_CHECKING:
    from .semantic import Embedded

Verify = Callable[[Reading, list[str]], Awaitable[list[bool]]]  # Embedder.verify: off the event loop

_SCHEMA = """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE IF NOT EXISTS velo_semantic (
    id bigserial PRIMARY KEY, scope text NOT NULL, embedding vector({dim}) NOT NULL, query text NOT NULL,
    payload bytea NOT NULL, expires_at double precision NOT NULL);
CREATE INDEX IF NOT EXISTS velo_semantic_scope ON velo_semantic (scope, expires_at);
"""
# Within one scope (tenant + model + system prompt + tools + options + earlier turns) rows are few, so an exact
# scan ordered by inner product beats an approximate index whose recall a scope filter would cut.
_SEARCH = """SELECT query, payload, -(embedding <#> %s::vector) AS score FROM velo_semantic
    WHERE scope = %s AND expires_at > extract(epoch from now()) ORDER BY embedding <#> %s::vector LIMIT %s"""
_ADD = "INSERT INTO velo_semantic (scope, embedding, query, payload, expires_at) VALUES (%s, %s::vector, %s, %s, %s)"
_PRUNE = "DELETE FROM velo_semantic WHERE expires_at <= extract(epoch from now())"
_PRUNE_EVERY = 100


def _literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector.tolist()) + "]"


async def _connect(dsn: str, dim: int) -> AsyncConnection:
    conn = await AsyncConnection.connect(dsn, autocommit=True)
    await conn.execute(_SCHEMA.format(dim=dim))
    return conn


@dataclass
class PgVectorStore:
    conn: AsyncConnection
    dsn: str
    dim: int
    name: str = "pgvector"
    _adds: int = 0
    _reconnecting: asyncio.Lock = field(default_factory=asyncio.Lock)  # lookups at once open one connection, not each

    @classmethod
    async def open(cls, dsn: str, dim: int) -> "PgVectorStore":
        return cls(await _connect(dsn, dim), dsn, dim)

    async def _execute(self, query: str, params: tuple) -> AsyncCursor:
        """psycopg never reconnects by itself: once PostgreSQL restarted (or dropped the connection), every call
        failed until Velo itself was restarted. A lost connection is opened again on the next call."""
        async with self._reconnecting:
            if self.conn.closed:
                self.conn = await _connect(self.dsn, self.dim)
        return await self.conn.execute(query, params)

    async def search(self, scope: str, query: "Embedded", threshold: float, verify: Verify,
                     k: int = 8) -> bytes | None:
        """The best stored answer at or above `threshold` whose text the verifier lets answer the query."""
        literal = _literal(query.vector)
        cur = await self._execute(_SEARCH, (literal, scope, literal, k))
        above = [(text, payload) for text, payload, score in await cur.fetchall() if score >= threshold]
        if not above:
            return None
        verdicts = await verify(query.reading, [text for text, _ in above])
        return next((bytes(payload) for (_, payload), ok in zip(above, verdicts) if ok), None)

    async def add(self, scope: str, vector: np.ndarray, text: str, payload: bytes, expires_at: float) -> None:
        await self._execute(_ADD, (scope, _literal(vector), text, payload, expires_at))
        self._adds += 1
        if self._adds % _PRUNE_EVERY == 0:
            await self._execute(_PRUNE, ())

    async def close(self) -> None:
        await self.conn.close()
