"""/metrics: Prometheus text from the app's own registry, fed by real requests through both dialects."""
from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import make_app
from proxy.config import Config, parse_config
from proxy.state import GENERATIONS
from proxy.stages.repair import Repair
from proxy.tools.metrics import ModelCounts
from tests.scripted import Script, ScriptedBackend

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(c: TestClient) -> dict:
    resp = await c.get("/metrics")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    return samples(await resp.text())


async def test_requests_latency_ttft_tokens_and_live_state_are_exported():
    backend = ScriptedBackend("s", script=Script(pieces=["a", "b", "c"], delay=0.01))
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as c:
        assert (await c.post("/api/chat", json=CHAT)).status == 200
        await (await c.post("/api/chat", json=CHAT)).read()
        await (await c.post("/v1/chat/completions", json={**CHAT, "stream": True})).read()
        await (await c.post("/api/embed", json={"model": "tiny", "input": ["x", "yy"]})).read()
        broken = ScriptedBackend(script=Script(fail_after=0))
        backend.chat = broken.chat  # type: ignore[method-assign]
        assert (await c.post("/v1/chat/completions", json=CHAT)).status == 502
        found = await scrape(c)
    ollama = {"endpoint": "/api/chat", "model": "tiny", "backend": "s"}
    assert value(found, "velo_requests_total", **ollama, status="200") == 2
    assert value(found, "velo_requests_total", endpoint="/v1/chat/completions", model="tiny", backend="s",
                 status="200") == 1
    assert value(found, "velo_requests_total", endpoint="/v1/chat/completions", model="tiny", backend="s",
                 status="502") == 1
    assert value(found, "velo_requests_total", endpoint="/api/embed", model="tiny", backend="s", status="200") == 1
    assert value(found, "velo_request_seconds_count", **ollama) == 2
    assert value(found, "velo_time_to_first_token_seconds_count", **ollama) == 2
    assert value(found, "velo_completion_tokens_total", model="tiny", backend="s") == 9  # usage says 3 each
    assert value(found, "velo_tokens_per_second_count", model="tiny", backend="s") == 3
    assert value(found, "velo_backend_slots", backend="s") == 4
    assert value(found, "velo_queue_depth", backend="s") == 0 and value(found, "velo_in_flight", backend="s") == 0
    assert value(found, "velo_embed_backend_calls_total", backend="s") == 1
    assert ("velo_coalesced_total", ()) in found


async def test_requests_that_reach_no_model_are_counted_once_under_their_route():
    """401s, bodies too large or unparseable, unknown routes used to be in no series: a client with a stale key showed
    nowhere. They count under the route asked (an unknown path as "other") with no model; a request the observe stage
    saw is not counted again."""
    config = parse_config({"server": {"api_keys": ["k1"], "max_body_bytes": 4096}})
    key = {"Authorization": "Bearer k1"}
    async with TestClient(TestServer(make_app(config, {"s": ScriptedBackend("s")}))) as c:
        assert (await c.post("/api/chat", json=CHAT)).status == 401
        assert (await c.post("/v1/chat/completions", data=b"{", headers=key)).status == 400
        assert (await c.post("/api/chat", data=b" " * 5000, headers=key)).status == 413
        assert (await c.get("/v1/no/such/route", headers=key)).status == 404
        assert (await c.get("/api/tags", headers=key)).status == 200
        assert (await c.post("/api/chat", json={**CHAT, "stream": False}, headers=key)).status == 200
        assert (await c.post("/api/embed", json={"model": "tiny", "input": "x"}, headers=key)).status == 200
        found = await scrape(c)
    edge = {"model": "", "backend": ""}
    assert value(found, "velo_requests_total", endpoint="/api/chat", **edge, status="401") == 1
    assert value(found, "velo_requests_total", endpoint="/v1/chat/completions", **edge, status="400") == 1
    assert value(found, "velo_requests_total", endpoint="/api/chat", **edge, status="413") == 1
    assert value(found, "velo_requests_total", endpoint="other", **edge, status="404") == 1
    assert value(found, "velo_requests_total", endpoint="/api/tags", **edge, status="200") == 1
    assert value(found, "velo_requests_total", endpoint="/api/chat", model="tiny", backend="s", status="200") == 1
    assert value(found, "velo_requests_total", endpoint="/api/embed", model="tiny", backend="s", status="200") == 1
    assert sum(v for (name, _), v in found.items() if name == "velo_requests_total") == 7


async def test_each_app_has_its_own_registry():
    apps = [make_app(Config(), {"s": ScriptedBackend("s")}) for _ in range(2)]
    async with TestClient(TestServer(apps[0])) as a, TestClient(TestServer(apps[1])) as b:
        await (await a.post("/api/chat", json=CHAT)).read()
        assert value(await scrape(a), "velo_requests_total", endpoint="/api/chat", model="tiny", backend="s",
                     status="200") == 1
        assert value(await scrape(b), "velo_requests_total", endpoint="/api/chat", model="tiny", backend="s",
                     status="200") == 0


async def test_cache_and_tool_repair_counters_are_exported():
    app = make_app(Config(), {"s": ScriptedBackend("s")})
    greedy = {**CHAT, "stream": False, "options": {"temperature": 0}}
    async with TestClient(TestServer(app)) as c:
        app[GENERATIONS].current.pipeline.stage(Repair).metrics.by_model["tiny"] = ModelCounts(extracted=2, coerced=1)
        for _ in range(2):
            await (await c.post("/api/chat", json=greedy)).read()
        found = await scrape(c)
    assert value(found, "velo_tool_repairs_total", model="tiny", kind="extracted") == 2
    assert value(found, "velo_tool_repairs_total", model="tiny", kind="coerced") == 1
    hits = [v for (name, labels), v in found.items()
            if name == "velo_cache_events_total" and ("outcome", "hit") in labels]
    assert sum(hits) >= 1
    assert value(found, "velo_cache_size", what="memory_entries") >= 1


async def test_model_names_nobody_serves_share_one_label():
    """Any name a client sent used to become a label: 10,000 names took RSS from 73 to 224 MB and /metrics to
    52 MB. Only listed, routed or aliased names are labels now; the rest are "other"."""
    config = parse_config({"aliases": {"fast": "tiny"}, "routes": [{"match": "coder-*", "backend": "s"}],
                           "backends": [{"name": "s", "kind": "openai", "url": "http://scripted"}]})
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    async with TestClient(TestServer(make_app(config, {"s": ScriptedBackend("s")}))) as c:
        for n in range(60):
            for model in (f"made-up-{n}", f"coder-{n}"):
                body = {"model": model, "messages": CHAT["messages"], "tools": [tool], "stream": False}
                assert (await c.post("/api/chat", json=body)).status == 200
                await (await c.post("/api/embed", json={"model": model, "input": "x"})).read()
        await (await c.post("/api/chat", json={**CHAT, "model": "fast"})).read()
        found = await scrape(c)
    labels = {dict(labels).get("model") for (_, labels) in found} - {None}
    assert labels == {"other", "coder-*", "fast"}, labels
    assert value(found, "velo_requests_total", endpoint="/api/chat", model="other", backend="s",
                 status="200") == 60
