"""The shared tiers against the real servers: Redis for exact answers, PostgreSQL+pgvector for semantic ones."""
from __future__ import annotations

import uuid

from adapters.protocol import ChatRequest, Chunk, Message, SamplingOptions
from proxy.cache import CacheConfig, CacheLayer
from proxy.cache.semantic import Embedder

ANSWER = [Chunk("cached"), Chunk(finish_reason="stop")]


def _ask(text: str) -> ChatRequest:
    return ChatRequest("tiny", [Message("user", text)], options=SamplingOptions(temperature=0))


async def test_redis_shares_exact_answers_between_processes(redis_url: str):
    a = await CacheLayer.create(CacheConfig(redis_url=redis_url))
    b = await CacheLayer.create(CacheConfig(redis_url=redis_url))
    question = f"hi {uuid.uuid4()}"
    await a.store(a.asked(_ask(question), "t"), ANSWER)
    hit = await b.lookup(b.asked(_ask(question), "t"))
    assert hit.kind == "exact" and hit.chunks == ANSWER
    assert b.stats()["events"]["redis"]["tiny"] == {"hit": 1}
    assert await b.lookup(b.asked(_ask(question), "other")) is None
    await a.close()
    await b.close()


async def test_pgvector_shares_semantic_answers_between_processes(pg_dsn: str, embedder: Embedder):
    cfg = CacheConfig(semantic=True, pg_dsn=pg_dsn)
    a = await CacheLayer.create(cfg, embedder=embedder)
    b = await CacheLayer.create(cfg, embedder=embedder)
    tenant = str(uuid.uuid4())
    await a.store(a.asked(_ask("How do I learn Python quickly?"), tenant), ANSWER)
    hit = await b.lookup(b.asked(_ask("How can I learn Python fast?"), tenant))
    assert hit is not None and hit.kind == "semantic" and hit.chunks == ANSWER
    assert b.stats()["events"]["pgvector"]["tiny"] == {"hit": 1}
    assert await b.lookup(b.asked(_ask("How can I learn Python fast?"), "other")) is None
    await a.store(a.asked(_ask("Is it safe to eat raw eggs?"), tenant), ANSWER)
    assert await b.lookup(b.asked(_ask("Is it not safe to eat raw eggs?"), tenant)) is None
    await a.store(a.asked(_ask("How do I convert rows to columns in Excel?"), tenant), ANSWER)  # verified as locally
    assert await b.lookup(b.asked(_ask("How do I convert columns to rows in Excel?"), tenant)) is None
    await a.store(a.asked(_ask("How do I increase my metabolism?"), tenant), ANSWER)
    assert await b.lookup(b.asked(_ask("How do I decrease my metabolism?"), tenant)) is None
    await a.close()
    await b.close()


async def test_pgvector_never_compares_vectors_of_different_encoders(pg_dsn: str, embedder: Embedder):
    """Two proxies on one database, one embedding in int8 and one in float32: same dimension, not the same
    vectors, so neither answers from the other's entries."""
    other = await Embedder.load(precision="float32" if "int8" in embedder.model.name else "int8")
    cfg = CacheConfig(semantic=True, pg_dsn=pg_dsn)
    a, same, different = [await CacheLayer.create(cfg, embedder=e) for e in (embedder, embedder, other)]
    tenant = str(uuid.uuid4())
    await a.store(a.asked(_ask("How do I learn Python quickly?"), tenant), ANSWER)
    assert await different.lookup(different.asked(_ask("How can I learn Python fast?"), tenant)) is None
    assert (await same.lookup(same.asked(_ask("How can I learn Python fast?"), tenant))).kind == "semantic"
    for layer in (a, same, different):
        await layer.close()
    await other.close()
