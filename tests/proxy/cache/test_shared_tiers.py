"""The shared tiers against the real servers: Redis for exact answers, PostgreSQL+pgvector for semantic ones."""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import redis.asyncio as aioredis
from psycopg import AsyncConnection

from adapters.protocol import ChatRequest, Chunk, Message, SamplingOptions
from proxy.cache import CacheConfig, CacheLayer
from proxy.cache import layer as layer_module
from proxy.cache.redis_store import RedisStore
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


async def test_a_redis_that_hangs_costs_a_miss_not_the_requests_time():
    """A server that takes the connection and never answers (a stopped process behind its open socket): lookup and
    store each waited out the client's 5-s socket timeout, before the backend call and after the answer."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    layer = await CacheLayer.create(CacheConfig())
    layer.stores.append(RedisStore(aioredis.from_url(f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0")))
    asked = layer.asked(_ask(f"hi {uuid.uuid4()}"), "t")
    assert await asyncio.wait_for(layer.lookup(asked), 3) is None
    started = time.monotonic()  # then left alone for a while: each request waited out the timeout twice
    assert await layer.store(asked, ANSWER) and await layer.lookup(layer.asked(_ask("other"), "t")) is None
    assert time.monotonic() - started < 0.5
    assert layer.stats()["events"]["redis"]["tiny"] == {"error": 3}
    await layer.close()
    server.close()


async def test_a_tier_that_failed_is_asked_again_after_its_rest(monkeypatch):
    monkeypatch.setattr(layer_module, "TIER_RETRY_S", 0.2)
    calls = []

    class Flaky:
        name = "flaky"

        async def get(self, key: str) -> None:
            calls.append(key)
            if len(calls) == 1:
                raise ConnectionError("down")

        async def close(self) -> None:
            pass

    layer = await CacheLayer.create(CacheConfig())
    layer.stores.append(Flaky())
    asked = layer.asked(_ask("hi"), "t")
    for _ in range(3):
        assert await layer.lookup(asked) is None
    assert len(calls) == 1  # resting
    await asyncio.sleep(0.25)
    assert await layer.lookup(asked) is None and len(calls) == 2
    await layer.close()


async def test_a_locked_pgvector_table_costs_a_miss_not_the_requests_time(pg_dsn: str, embedder: Embedder,
                                                                          monkeypatch):
    """A lock on the table (a migration, VACUUM FULL) held every semantic lookup for as long as it lasted; once it
    is gone (and the tier's rest is over) the tier serves again."""
    monkeypatch.setattr(layer_module, "TIER_RETRY_S", 0)
    cfg = CacheConfig(semantic=True, pg_dsn=pg_dsn)
    a = await CacheLayer.create(cfg, embedder=embedder)
    b = await CacheLayer.create(cfg, embedder=embedder)
    tenant = str(uuid.uuid4())
    locker = await AsyncConnection.connect(pg_dsn)
    await locker.execute("LOCK TABLE velo_semantic IN ACCESS EXCLUSIVE MODE")
    assert await asyncio.wait_for(b.lookup(b.asked(_ask("How can I learn Python fast?"), tenant)), 3) is None
    assert b.stats()["events"]["pgvector"]["tiny"] == {"error": 1}
    await locker.rollback()
    await locker.close()
    await a.store(a.asked(_ask("How do I learn Python quickly?"), tenant), ANSWER)
    assert (await b.lookup(b.asked(_ask("How can I learn Python fast?"), tenant))).kind == "semantic"
    await a.close()
    await b.close()


async def _stored_and_other(pg_dsn: str, embedder: Embedder,
                            monkeypatch) -> tuple[CacheLayer, CacheLayer, str]:
    """Two layers on one PostgreSQL, a question's answer stored through the first, the tier asked again at once
    after a failure."""
    monkeypatch.setattr(layer_module, "TIER_RETRY_S", 0)
    cfg = CacheConfig(semantic=True, pg_dsn=pg_dsn)
    a = await CacheLayer.create(cfg, embedder=embedder)
    b = await CacheLayer.create(cfg, embedder=embedder)
    tenant = str(uuid.uuid4())
    await a.store(a.asked(_ask("How do I learn Python quickly?"), tenant), ANSWER)
    return a, b, tenant


async def test_pgvector_serves_again_once_its_connection_was_lost(pg_dsn: str, embedder: Embedder, monkeypatch):
    """PostgreSQL restarted (here: the connection ended by the server, as a restart ends it): psycopg does not
    reconnect, so every semantic lookup and store after it failed until Velo itself was restarted."""
    a, b, tenant = await _stored_and_other(pg_dsn, embedder, monkeypatch)
    async with await AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (b.pg.conn.info.backend_pid,))
    assert await b.lookup(b.asked(_ask("How can I learn Python fast?"), tenant)) is None  # found the loss
    assert (await b.lookup(b.asked(_ask("How can I learn Python fast?"), tenant))).kind == "semantic"
    assert b.stats()["events"]["pgvector"]["tiny"] == {"error": 1, "hit": 1}
    await a.close()
    await b.close()


async def test_a_postgresql_that_hangs_costs_the_tier_timeout_not_six_seconds(pg_dsn: str, embedder: Embedder,
                                                                               monkeypatch):
    """Its server process stopped (a hung host): psycopg, its query cancelled at TIER_TIMEOUT_S, waits 5 s more for
    the server to end it, so the lookup took 6.0 s. Then the tier serves again on a connection of its own."""
    a, b, tenant = await _stored_and_other(pg_dsn, embedder, monkeypatch)
    hung = b.pg.conn.info.backend_pid
    os.kill(hung, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert await b.lookup(b.asked(_ask("How can I learn Python fast?"), tenant)) is None
        # 6.0 s before; the margin is the query's embedding on a busy machine
        assert time.monotonic() - started < layer_module.TIER_TIMEOUT_S + 3
        while b.tier_calls.unwinding:  # psycopg gives the connection up
            await asyncio.sleep(0.1)
        assert (await b.lookup(b.asked(_ask("How can I learn Python fast?"), tenant))).kind == "semantic"
    finally:
        os.kill(hung, signal.SIGCONT)
    await a.close()
    await b.close()
