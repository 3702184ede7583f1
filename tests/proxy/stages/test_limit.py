"""The limit stage over HTTP: 429 with Retry-After in each dialect, the dialect's rate-limit headers on every answer,
cache hits free of tokens, counts on /metrics."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.errors import BackendUnavailable
from adapters.protocol import Chunk
from proxy import pipeline
from proxy.app import make_app
from proxy.auth import tenant_of
from proxy.batching.config import BatchingConfig
from proxy.cache.config import CacheConfig
from proxy.config import Config, ServerConfig, ToolsConfig
from proxy.job import Job
from proxy.limits import LimitsConfig
from proxy.stages.base import Next, Stage
from proxy.stages.coalesce import Coalesce
from proxy.stages.limit import headers
from proxy.state import GENERATIONS
from proxy.limits import State
from tests.proxy.test_metrics import scrape, value
from tests.proxy.tools.test_http import BAD, CALL, MESSAGES, WEATHER, Answers
from tests.scripted import Script, ScriptedBackend

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
KEYS = ["k1", "k2"]


def app(**limits) -> TestClient:
    cfg = Config(server=ServerConfig(api_keys=KEYS), limits=LimitsConfig(**limits))
    return TestClient(TestServer(make_app(cfg, {"s": ScriptedBackend("s", script=Script(delay=0.05))})))


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_each_dialect_gets_429_with_retry_after_and_its_own_headers():
    async with app(requests_per_minute=6, request_burst=1) as c:
        ok = await c.post("/v1/chat/completions", json=CHAT, headers=auth("k1"))
        assert ok.status == 200
        assert ok.headers["x-ratelimit-limit-requests"] == "1" and ok.headers["x-ratelimit-remaining-requests"] == "0"
        assert ok.headers["x-ratelimit-reset-requests"] == "10s"
        refused = await c.post("/v1/chat/completions", json=CHAT, headers=auth("k1"))
        body = await refused.json()
        assert refused.status == 429 and refused.headers["Retry-After"] == "10"
        assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "rate_limit_exceeded"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        anthropic = await c.post("/v1/messages", json={**CHAT, "max_tokens": 20}, headers={"x-api-key": "k1"})
        assert anthropic.status == 429 and (await anthropic.json())["error"]["type"] == "rate_limit_error"
        assert anthropic.headers["anthropic-ratelimit-requests-limit"] == "1"
        assert anthropic.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
        ollama = await c.post("/api/chat", json=CHAT, headers=auth("k1"))
        assert ollama.status == 429 and "error" in await ollama.json() and ollama.headers["Retry-After"]
        assert (await c.post("/api/chat", json=CHAT, headers=auth("k2"))).status == 200  # another key
        found = await scrape(c)
    refused_k1 = [v for (name, labels), v in found.items() if name == "velo_rate_limited_total"
                  and ("limit", "requests") in labels]
    assert refused_k1 == [3]
    assert value(found, "velo_requests_total", endpoint="/api/chat", model="tiny", backend="s", status="429") == 1


async def test_concurrency_per_key_and_tokens_not_charged_for_cache_hits():
    async with app(concurrency=1, tokens_per_minute=1000) as c:
        slow = asyncio.create_task(c.post("/api/chat", json={**CHAT, "stream": True}, headers=auth("k1")))
        await asyncio.sleep(0.02)
        busy = await c.post("/api/chat", json=CHAT, headers=auth("k1"))
        assert busy.status == 429 and busy.headers["Retry-After"] == "1"
        await (await slow).read()
        greedy = {**CHAT, "stream": False, "options": {"temperature": 0}}
        first = await c.post("/v1/chat/completions", json=greedy, headers=auth("k2"))
        spent = 1000 - int(first.headers["x-ratelimit-remaining-tokens"])
        hit = await c.post("/v1/chat/completions", json=greedy, headers=auth("k2"))
        assert hit.headers["X-Velo-Cache"] == "exact"
        after = await c.post("/v1/chat/completions", json={**greedy, "seed": 7}, headers=auth("k2"))
        # the first answer's real usage (prompt + 3 tokens) was charged; the cache hit only its estimate, refunded
        assert 0 < spent and int(after.headers["x-ratelimit-remaining-tokens"]) >= 1000 - 2 * spent - 10


async def test_embeddings_carry_the_keys_headers_and_are_charged_the_backends_count():
    """/v1/embeddings had no x-ratelimit headers, and was charged its size's estimate (~100 tokens an input here)
    where the backend counted 1."""
    body = {"model": "tiny", "input": ["a" * 400, "b" * 400]}
    async with app(tokens_per_minute=1000) as c:
        first = await c.post("/v1/embeddings", json=body, headers=auth("k1"))
        second = await c.post("/v1/embeddings", json=body, headers=auth("k1"))
        ollama = await c.post("/api/embed", json=body, headers=auth("k1"))
    assert first.status == second.status == ollama.status == 200
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 800  # the estimate, taken up front
    assert int(second.headers["x-ratelimit-remaining-tokens"]) >= 1000 - 2 - 200  # the first trued up to 2
    assert not any(h.startswith("x-ratelimit") for h in ollama.headers)  # Ollama's API has none


async def test_a_retried_answer_is_charged_every_backend_call_it_made():
    """With `tools.max_retries`, an invalid tool call is asked again: the backend answered twice (5 prompt tokens
    and 1 output token each, as it counted them), and the key was charged only the answer it sent, 6 of 12."""
    backend = Answers(Script(pieces=[BAD]), Script(pieces=[CALL]))
    cfg = Config(server=ServerConfig(api_keys=KEYS), limits=LimitsConfig(tokens_per_minute=1000),
                 tools=ToolsConfig(max_retries=1))
    async with TestClient(TestServer(make_app(cfg, {"s": backend}))) as c:
        limits = c.server.app[GENERATIONS].current.pipeline.limit.limits
        limits.clock = lambda: 0.0  # no refill while it runs
        resp = await c.post("/v1/chat/completions", json={**CHAT, "messages": MESSAGES, "tools": [WEATHER]},
                            headers=auth("k1"))
        assert resp.status == 200 and "retry=1" in resp.headers["X-Velo-Repair"] and len(backend.requests) == 2
        [key] = limits.keys.values()
        assert key.tokens.level == 1000 - 12


@pytest.mark.parametrize("refusal", ["queue full", "backend down"])
async def test_a_request_refused_before_its_answer_began_costs_no_tokens(refusal: str):
    """Velo's queue full (429, Retry-After) or the backend down (503): no backend spent a token, yet the key was
    charged the prompt's estimate each time (a generation's, an embedding's), so a client retrying as told ran out
    of tokens_per_minute and got the limit's own 429 once the backend could serve it."""
    class Down(ScriptedBackend):
        def chat(self, req):
            raise BackendUnavailable("backend 's' at http://127.0.0.1:1 is not reachable")

        async def embed(self, req):
            self.chat(req)
    backend = Down("s") if refusal == "backend down" else ScriptedBackend("s", script=Script(delay=0.05))
    backend.config.max_concurrency = 1
    cfg = Config(server=ServerConfig(api_keys=KEYS), limits=LimitsConfig(tokens_per_minute=1000),
                 batching=BatchingConfig(max_queue=0), cache=CacheConfig(enabled=False))
    async with TestClient(TestServer(make_app(cfg, {"s": backend}))) as c:
        limits = c.server.app[GENERATIONS].current.pipeline.limit.limits
        limits.clock = lambda: 0.0  # no refill while it runs
        running = asyncio.create_task(c.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                             headers=auth("k2")))
        await asyncio.sleep(0.02)
        prompt = {**CHAT, "messages": [{"role": "user", "content": "word " * 200}]}
        statuses = [(await c.post("/v1/chat/completions", json=prompt, headers=auth("k1"))).status for _ in range(3)]
        embedding = await c.post("/v1/embeddings", json={"model": "tiny", "input": "word " * 200}, headers=auth("k1"))
        await (await running).read()
        assert statuses + [embedding.status] == [429 if refusal == "queue full" else 503] * 4
        assert limits.keys[tenant_of("k1")].tokens.level == 1000


async def test_a_request_that_rode_on_an_identical_ones_backend_call_costs_no_tokens():
    """Coalescing: three identical requests of a key, one backend call; the key was charged its answer three times."""
    backend = ScriptedBackend("s", script=Script(delay=0.1))
    cfg = Config(server=ServerConfig(api_keys=KEYS), limits=LimitsConfig(tokens_per_minute=1000),
                 cache=CacheConfig(enabled=False))
    async with TestClient(TestServer(make_app(cfg, {"s": backend}))) as c:
        limits = c.server.app[GENERATIONS].current.pipeline.limit.limits
        limits.clock = lambda: 0.0  # no refill while it runs
        greedy = {**CHAT, "temperature": 0}
        answers = await asyncio.gather(*(c.post("/v1/chat/completions", json=greedy, headers=auth("k1"))
                                         for _ in range(3)))
        usage = [(await a.json())["usage"]["total_tokens"] for a in answers]
        assert len(backend.requests) == 1 and len(set(usage)) == 1
        assert limits.keys[tenant_of("k1")].tokens.level == 1000 - usage[0]


async def test_a_shared_call_whose_first_request_left_is_charged_whole_to_the_one_that_stayed(caplog):
    """The same greedy request twice, the first dropped after two pieces: the first was charged what it got (its
    prompt's estimate and two pieces), the second, riding on its call, nothing, though it got the whole answer (the
    backend's 5 prompt tokens and 20 output): a key had any answer nearly free. The call is charged once, whole."""
    backend = ScriptedBackend("s", script=Script(pieces=[f" w{i}" for i in range(20)], delay=0.02))
    cfg = Config(server=ServerConfig(api_keys=KEYS), limits=LimitsConfig(tokens_per_minute=1000),
                 cache=CacheConfig(enabled=False))
    caplog.set_level(logging.INFO, logger="velo.requests")
    async with TestClient(TestServer(make_app(cfg, {"s": backend}))) as c:
        limits = c.server.app[GENERATIONS].current.pipeline.limit.limits
        limits.clock = lambda: 0.0  # no refill while it runs
        greedy = {**CHAT, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        leader = await c.post("/v1/chat/completions", json=greedy, headers=auth("k1"))
        follower = asyncio.create_task(c.post("/v1/chat/completions", json=greedy, headers=auth("k1")))
        await asyncio.sleep(0.01)
        for _ in range(4):  # the role's chunk, two pieces (and a blank line between each)
            await leader.content.readline()
        leader.close()
        body = await (await follower).text()
        usage = [json.loads(line[6:])["usage"] for line in body.splitlines() if line.startswith("data: {")]
        for _ in range(50):
            if not limits.running():
                break
            await asyncio.sleep(0.02)
        assert len(backend.requests) == 1 and "w19" in body
        assert usage[-1]["total_tokens"] == 25  # what the follower is told it used: the whole call
        assert limits.keys[tenant_of("k1")].tokens.level == 1000 - 25
    ends = [r.getMessage() for r in caplog.records if r.name == "velo.requests" and "after" in r.getMessage()]
    assert any("done (stop)" in line and "20 tokens" in line for line in ends)  # the follower's own log line


class Stall(Stage):
    """The first request stops taking its answer after two pieces (a client that stopped reading) until `go`, then
    leaves."""
    go: asyncio.Event
    jobs = 0

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        Stall.jobs += 1
        first, pieces = Stall.jobs == 1, 0
        async with contextlib.aclosing(next(job)) as rest:
            async for chunk in rest:
                pieces += bool(chunk.text)
                yield chunk
                if first and pieces == 2:
                    await Stall.go.wait()
                    return


async def test_a_shared_call_whose_first_request_left_after_the_other_got_it_all_is_charged_whole(monkeypatch):
    """The first of two identical greedy requests stopped reading after two pieces, the second got the whole answer
    and ended (charged nothing), then the first left: charged what it got, the key had the whole answer for 3 of its
    25 tokens. The one that left pays for the call, as nobody who got it is still there."""
    stages = list(pipeline.STAGES)
    stages.insert(stages.index(Coalesce), Stall)
    monkeypatch.setattr(pipeline, "STAGES", tuple(stages))
    Stall.go, Stall.jobs = asyncio.Event(), 0
    backend = ScriptedBackend("s", script=Script(pieces=[f" w{i}" for i in range(20)], delay=0.02))
    cfg = Config(server=ServerConfig(api_keys=KEYS), limits=LimitsConfig(tokens_per_minute=1000),
                 cache=CacheConfig(enabled=False))
    async with TestClient(TestServer(make_app(cfg, {"s": backend}))) as c:
        limits = c.server.app[GENERATIONS].current.pipeline.limit.limits
        limits.clock = lambda: 0.0  # no refill while it runs
        greedy = {**CHAT, "temperature": 0, "stream": True}
        leader = asyncio.create_task(c.post("/v1/chat/completions", json=greedy, headers=auth("k1")))
        await asyncio.sleep(0.01)
        follower = await c.post("/v1/chat/completions", json=greedy, headers=auth("k1"))
        assert "w19" in await follower.text()
        Stall.go.set()
        await (await leader).read()
        assert len(backend.requests) == 1 and not limits.running()
        assert limits.keys[tenant_of("k1")].tokens.level == 1000 - 25


async def test_keys_nobody_configured_share_one_label_on_metrics():
    """Without `api_keys` any client may send made-up keys, each its own scope; on /metrics they are `other`
    (before: one label each, without bound, as the made-up model names of issue 20)."""
    cfg = Config(limits=LimitsConfig(requests_per_minute=60, request_burst=1))
    async with TestClient(TestServer(make_app(cfg, {"s": ScriptedBackend("s")}))) as c:
        for i in range(20):
            for _ in range(2):
                await c.post("/api/chat", json={**CHAT, "stream": False}, headers=auth(f"made-up-{i}"))
        assert (await c.post("/api/chat", json={**CHAT, "stream": False})).status == 200  # no key: anonymous
        assert (await c.post("/api/chat", json={**CHAT, "stream": False})).status == 429
        found = await scrape(c)
    refused = {labels: v for (name, labels), v in found.items() if name == "velo_rate_limited_total"}
    assert refused == {(("key", "other"), ("limit", "requests")): 20,
                       (("key", "anonymous"), ("limit", "requests")): 1}


async def test_a_keys_label_on_metrics_says_nothing_a_weak_key_can_be_guessed_from():
    """/metrics needs no key, and it labelled each key by the first 16 hex digits of its bare SHA-256: a weak key
    could be found offline by hashing guesses. The label is the key's place in the config."""
    async with app(requests_per_minute=60, request_burst=1) as c:
        for key in KEYS[::-1]:
            for _ in range(2):
                await c.post("/api/chat", json={**CHAT, "stream": False}, headers=auth(key))
        found = await scrape(c)
    refused = {dict(labels)["key"] for (name, labels), _ in found.items() if name == "velo_rate_limited_total"}
    assert refused == {"key1", "key2"}


def test_openai_reset_durations_are_written_as_openai_writes_them():
    out = headers("openai", State(requests=(60, 59, 0.012), tokens=(1000, 10, 361.0)))
    assert out["x-ratelimit-reset-requests"] == "12ms" and out["x-ratelimit-reset-tokens"] == "6m1s"
    assert headers("ollama", State(requests=(1, 0, 1.0))) == {}


async def test_a_request_of_several_choices_is_admitted_once_and_refused_whole():
    """Each of `n` choices was admitted as a request: with one request at once allowed, `n = 2` was refused every
    time (its 429 saying to retry); with a burst of 2, `n = 3` was refused after 2 choices were charged, and a
    refused non-streamed request's other choices ran on to their end, holding the key's slot."""
    backend = ScriptedBackend("s", script=Script(delay=0.1))
    cfg = Config(server=ServerConfig(api_keys=KEYS), limits=LimitsConfig(concurrency=1, requests_per_minute=6,
                                                                         request_burst=2))
    async with TestClient(TestServer(make_app(cfg, {"s": backend}))) as c:
        for stream in (False, True):
            ok = await c.post("/v1/chat/completions", json={**CHAT, "n": 3, "stream": stream}, headers=auth("k1"))
            assert ok.status == 200, await ok.text()
            await ok.read()
        asked = len(backend.requests)
        refused = await c.post("/v1/chat/completions", json={**CHAT, "n": 3}, headers=auth("k1"))
        assert refused.status == 429
        assert len(backend.requests) == asked  # none of its choices reached the backend (they were charged too)
        assert value(await scrape(c), "velo_key_in_flight", key="key1") in (None, 0.0)
    # the slot is held until the request's last choice ends: let go at its first, another request got in beside it
    class Uneven(ScriptedBackend):
        """The first choice asked is answered at once, the second in 0.6 s."""

        def chat(self, req):  # noqa: ANN001, ANN201
            self.script = Script(pieces=["a"]) if not self.requests else Script(delay=0.1, pieces=["a"] * 6)
            return super().chat(req)
    uneven = Uneven("s")
    cfg = Config(server=ServerConfig(api_keys=KEYS), limits=LimitsConfig(concurrency=1))
    async with TestClient(TestServer(make_app(cfg, {"s": uneven}))) as c:
        running = asyncio.create_task(c.post("/v1/chat/completions", json={**CHAT, "n": 2}, headers=auth("k1")))
        while uneven.completed < 1:  # one choice has ended, the other runs
            await asyncio.sleep(0.01)
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=auth("k1"))).status == 429
        assert (await running).status == 200


async def test_a_refused_request_leaves_its_models_residency_as_it_was():
    """The keep-loaded stage ran before the limits: a request refused with a 429 still set how long its model
    stays, and `keep_alive: 0` unloaded it from under the key's other requests."""
    class Resident(ScriptedBackend):
        idle_unload = True  # Velo unloads its model itself, as the engine's
        unloads = 0

        async def unload(self, model: str) -> None:
            self.unloads += 1
    backend = Resident("s")
    cfg = Config(server=ServerConfig(api_keys=KEYS), limits=LimitsConfig(requests_per_minute=6, request_burst=1))
    async with TestClient(TestServer(make_app(cfg, {"s": backend}))) as c:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        assert (await c.post("/api/chat", json={**body, "keep_alive": "1h"}, headers=auth("k1"))).status == 200
        refused = await c.post("/api/chat", json={**body, "keep_alive": 0}, headers=auth("k1"))
        assert refused.status == 429
        await asyncio.sleep(0.3)  # the unload timer's turn
        assert backend.unloads == 0
