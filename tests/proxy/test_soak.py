"""A bounded soak: thousands of mixed requests (both dialects, streams, FIM, embeds, duplicates, clients that
leave mid-stream) through real HTTP, then proof that tasks, sockets, queue slots and memory did not grow."""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import random
import resource

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.app import make_app
from proxy.batching.config import BatchingConfig
from proxy.cache.config import CacheConfig
from proxy.config import Config
from proxy.state import GENERATIONS
from proxy.stages.admit import Admit
from proxy.stages.coalesce import Coalesce
from tests.scripted import Script, ScriptedBackend

ROUNDS = 1200  # per phase; two phases
CONCURRENCY = 32


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


async def one(c: aiohttp.ClientSession, rng: random.Random) -> int:
    """One random request; returns the HTTP status (0: the client left on purpose)."""
    kind = rng.randrange(7)
    msgs = [{"role": "user", "content": f"q{rng.randrange(20)}"}]
    if kind == 0:
        resp = await c.post("/api/chat", json={"model": "tiny", "messages": msgs, "options": {"temperature": 0}})
    elif kind == 1:
        resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs, "stream": True,
                                                         "temperature": 0})
    elif kind == 2:
        resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs})
    elif kind == 3:
        resp = await c.post("/api/generate", json={"model": "tiny", "prompt": "def f(", "suffix": ")"},
                            headers={"X-Velo-Client": f"ide{rng.randrange(4)}"})
    elif kind == 4:
        resp = await c.post(rng.choice(["/api/embed", "/v1/embeddings"]), json={"model": "tiny", "input": "x"})
    else:  # a client that leaves after the first line, or before any
        resp = await c.post("/api/chat", json={"model": "tiny", "messages": msgs})
        if kind == 5:
            await resp.content.readline()
        resp.close()
        return 0
    await resp.read()
    return resp.status


async def phase(url: str, rng: random.Random) -> list[int]:
    """One round of traffic from its own client, closed at the end: the connections it kept alive (and their
    server-side handler tasks and sockets, as many as its reuse happened to leave) are not Velo's to keep."""
    gate = asyncio.Semaphore(CONCURRENCY)
    # a plain session: aiohttp's TestClient keeps every response it ever returned
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as c:

        async def limited() -> int:
            async with gate:
                return await one(c, rng)
        return await asyncio.gather(*[limited() for _ in range(ROUNDS)])


async def quiesce(backend: ScriptedBackend) -> tuple[int, int, int, int]:
    backend.requests.clear()  # the double's own record of every request is not Velo's memory
    for _ in range(20):
        await asyncio.sleep(0.02)
    gc.collect()
    return len(asyncio.all_tasks()), open_fds(), len(gc.get_objects()), rss_kib()


async def test_soak_mixed_traffic_leaves_no_tasks_sockets_slots_or_memory_behind(caplog):
    caplog.set_level(logging.ERROR, logger="velo")  # expected supersession warnings would pile up as records
    backend = ScriptedBackend("s", script=Script(pieces=["a", "b", "c", "d"], delay=0.002))
    config = Config(cache=CacheConfig(enabled=False), batching=BatchingConfig(embed_window_ms=2, max_queue=64))
    app = make_app(config, {"s": backend})
    rng = random.Random(6)
    async with TestServer(app, handler_cancellation=True) as server:
        first = await phase(str(server.make_url("")), rng)
        tasks1, fds1, objects1, rss1 = await quiesce(backend)
        second = await phase(str(server.make_url("")), rng)
        tasks2, fds2, objects2, rss2 = await quiesce(backend)
        pipeline = app[GENERATIONS].current.pipeline
        admission = pipeline.stage(Admit).controllers["s"]
        assert admission.running == 0 and admission.queued == 0
        assert pipeline.stage(Coalesce).coalescer.in_flight == 0
        assert not pipeline.embeddings.batchers["s"]._tasks and not pipeline.embeddings.batchers["s"]._open
    statuses = set(first) | set(second)
    assert statuses <= {0, 200, 429, 499}, statuses  # 499: an autocomplete replaced by a newer one
    assert sum(s == 200 for s in first + second) > ROUNDS  # most of the traffic was served
    assert backend.cancelled > 50 and pipeline.stage(Coalesce).coalescer.coalesced > 0
    assert tasks2 <= tasks1 + 2, (tasks1, tasks2)
    assert fds2 <= fds1 + 4, (fds1, fds2)
    assert objects2 - objects1 < 1000, (objects1, objects2)
    assert rss2 - rss1 < 8 * 1024, (rss1, rss2)
