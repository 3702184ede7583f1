"""Shared semantic tier: PostgreSQL + pgvector, so Velo processes share semantic entries as Redis shares exact
ones. Each row carries its answer and its text; the text is re-checked with the same guard as the local index,
so a shared hit is held to the same standard as a local one."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from psycopg import AsyncConnection

from .guard import Signature, compatible, signature

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


@dataclass
class PgVectorStore:
    conn: AsyncConnection
    name: str = "pgvector"
    _adds: int = 0

    @classmethod
    async def open(cls, dsn: str, dim: int) -> "PgVectorStore":
        conn = await AsyncConnection.connect(dsn, autocommit=True)
        await conn.execute(_SCHEMA.format(dim=dim))
        return cls(conn)

    async def search(self, scope: str, vector: np.ndarray, query: Signature, threshold: float,
                     k: int = 8) -> bytes | None:
        """The best stored answer at or above `threshold` whose text passes the guard against the query's."""
        literal = _literal(vector)
        cur = await self.conn.execute(_SEARCH, (literal, scope, literal, k))
        for text, payload, score in await cur.fetchall():
            if score >= threshold and compatible(query, signature(text)):
                return bytes(payload)
        return None

    async def add(self, scope: str, vector: np.ndarray, text: str, payload: bytes, expires_at: float) -> None:
        await self.conn.execute(_ADD, (scope, _literal(vector), text, payload, expires_at))
        self._adds += 1
        if self._adds % _PRUNE_EVERY == 0:
            await self.conn.execute(_PRUNE)

    async def close(self) -> None:
        await self.conn.close()
