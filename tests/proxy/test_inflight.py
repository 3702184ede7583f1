"""Runaway generations made visible and cancellable: every request's id in `X-Velo-Request-Id`, the list of
requests in flight (`GET /velo/requests`, /metrics, a log line past `long_request_s`), and an admin's cancel
(`DELETE /velo/requests/{id}`) that ends the stream with its dialect's error and cancels the backend's work."""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable

import orjson
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer

from proxy.auth import tenant_of
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config, ServerConfig
from tests.scripted import Script, ScriptedBackend

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def runaway() -> ScriptedBackend:
    return ScriptedBackend("s", script=Script(pieces=["tok "] * 2000, delay=0.01))


async def wait_for_request(c: TestClient, path: str) -> dict:
    for _ in range(200):
        listed = (await (await c.get("/velo/requests")).json())["requests"]
        running = [r for r in listed if r["path"] == path and r["tokens"] > 0]
        if running:
            return running[0]
        await asyncio.sleep(0.02)
    raise AssertionError("the request never showed up")


@pytest.mark.parametrize("path,body", [("/api/chat", CHAT), ("/v1/chat/completions", {**CHAT, "stream": True}),
                                       ("/v1/messages", {**CHAT, "max_tokens": 9000, "stream": True}),
                                       ("/v1/responses", {"model": "tiny", "input": "hi", "stream": True})])
async def test_a_running_stream_is_listed_then_cancelled_with_its_dialects_error(path: str, body: dict) -> None:
    backend = runaway()
    app = make_app(Config(cache=CacheConfig(enabled=False)), {"s": backend})
    async with TestClient(TestServer(app, handler_cancellation=True)) as c:
        resp = await c.post(path, json=body)
        request_id = resp.headers["X-Velo-Request-Id"]
        listed = await wait_for_request(c, path)
        assert listed["id"] == request_id and listed["models"] == ["tiny"] and listed["backends"] == ["s"]
        metrics = await (await c.get("/metrics")).text()
        assert "velo_requests_running 1.0" in metrics and "velo_request_oldest_seconds" in metrics
        cancelled = await c.delete(f"/velo/requests/{request_id}")
        assert cancelled.status == 200 and (await cancelled.json())["cancelled"] is True
        text = (await asyncio.wait_for(resp.read(), 10)).decode()
        assert "cancelled by an administrator" in text.strip().splitlines()[-1]
        assert (await (await c.get("/velo/requests")).json())["requests"] == []
        assert (await c.delete(f"/velo/requests/{request_id}")).status == 404
    assert backend.cancelled == 1 and backend.completed == 0


async def _cancelled_by_admin(c: TestClient, sent: Awaitable[ClientResponse]) -> tuple[ClientResponse, str]:
    """The answer to `sent` once an admin's DELETE /velo/requests/{id} ended it, and that id."""
    pending = asyncio.ensure_future(sent)
    for _ in range(200):
        listed = (await (await c.get("/velo/requests")).json())["requests"]
        if listed:
            break
        await asyncio.sleep(0.02)
    await c.delete(f"/velo/requests/{listed[0]['id']}")
    return await asyncio.wait_for(pending, 10), listed[0]["id"]


async def test_a_request_not_answering_yet_is_cancelled_with_a_499_in_its_dialect() -> None:
    backend = ScriptedBackend("s", script=Script(pieces=["x"], delay=5))  # not a byte before 5 s
    app = make_app(Config(cache=CacheConfig(enabled=False)), {"s": backend})
    async with TestClient(TestServer(app, handler_cancellation=True)) as c:
        resp, _ = await _cancelled_by_admin(c, c.post("/v1/chat/completions", json=CHAT))
        error = (await resp.json())["error"]
        assert resp.status == 499 and error["type"] == "request_cancelled" and "administrator" in error["message"]
    assert backend.cancelled == 1


async def test_an_anthropic_request_ended_by_velo_names_its_id_as_every_anthropic_error_does() -> None:
    """A request an admin (or a shutdown) ends before its first byte was answered without `request_id` and the
    `request-id` header, which every other Anthropic error carries (the SDK's `e.request_id` was None)."""
    backend = ScriptedBackend("s", script=Script(pieces=["x"], delay=5))
    app = make_app(Config(cache=CacheConfig(enabled=False)), {"s": backend})
    async with TestClient(TestServer(app, handler_cancellation=True)) as c:
        resp, request_id = await _cancelled_by_admin(c, c.post("/v1/messages", json={**CHAT, "max_tokens": 5}))
        said = await resp.json()
        assert resp.status == 499 and said["type"] == "error" and "administrator" in said["error"]["message"]
        assert said.get("request_id") == resp.headers.get("request-id") == request_id, (said, resp.headers)


async def test_an_answer_refused_before_it_is_listed_names_its_id_too() -> None:
    """401, 403 and 413 came from the middlewares before the list of requests, without an id; Anthropic's error
    body named one that no header did."""
    app = make_app(Config(server=ServerConfig(api_keys=["k"], max_body_bytes=1024)), {"s": ScriptedBackend()})
    async with TestClient(TestServer(app)) as c:
        refused = [await c.post("/api/chat", json=CHAT),
                   await c.post("/v1/messages", json={**CHAT, "max_tokens": 5}),
                   await c.post("/v1/chat/completions", json=CHAT, headers={"Origin": "https://evil.example"}),
                   await c.post("/api/chat", data=b"x" * 4096, headers={"Authorization": "Bearer k"})]
        assert [r.status for r in refused] == [401, 401, 403, 413]
        assert all(r.headers["X-Velo-Request-Id"].startswith("req_") for r in refused)
        said, headers = await refused[1].json(), refused[1].headers
        assert said["request_id"] == headers["X-Velo-Request-Id"] == headers["request-id"]
        assert "X-Velo-Request-Id" not in (await c.get("/health")).headers


class SlowToProbe(ScriptedBackend):
    """A backend whose health probe takes its time, as one that does not answer (the probe waits 2 s)."""

    async def health(self) -> bool:
        await asyncio.sleep(0.5)
        return False


async def test_the_dashboards_own_polls_are_no_requests_in_flight() -> None:
    """A dashboard left open polls /ui/state, which waits on each backend's health probe: with a backend down it
    was listed in /velo/requests and counted in velo_requests_running and velo_request_oldest_seconds, a request
    that was none, with an X-Velo-Request-Id (every /api and /v1 request's)."""
    app = make_app(Config(cache=CacheConfig(enabled=False)), {"s": SlowToProbe("s")})
    async with TestClient(TestServer(app)) as c:
        poll = asyncio.ensure_future(c.get("/ui/state"))
        await asyncio.sleep(0.25)
        assert (await (await c.get("/velo/requests")).json())["requests"] == []
        assert "velo_requests_running 0.0" in await (await c.get("/metrics")).text()
        answered = await poll
        assert answered.status == 200 and "X-Velo-Request-Id" not in answered.headers
        assert "X-Velo-Request-Id" not in (await c.get("/ui")).headers


async def test_with_api_keys_the_admin_routes_need_one() -> None:
    app = make_app(Config(server=ServerConfig(api_keys=["k"])), {"s": ScriptedBackend()})
    async with TestClient(TestServer(app)) as c:
        assert (await c.get("/velo/requests")).status == 401
        assert (await c.delete("/velo/requests/req_x")).status == 401
        assert (await c.get("/velo/requests", headers={"Authorization": "Bearer k"})).status == 200


async def test_admin_keys_alone_see_and_end_other_keys_requests() -> None:
    """With keys of different people, any of them could list every request in flight, cancel anyone's, and read the
    dashboard's recent prompts (with log_prompts); `admin_keys` keeps those to the keys named there."""
    config = Config(server=ServerConfig(api_keys=["sk-alice"], admin_keys=["sk-root"]))
    app = make_app(config, {"s": ScriptedBackend()})
    alice, root = {"Authorization": "Bearer sk-alice"}, {"Authorization": "Bearer sk-root"}
    async with TestClient(TestServer(app)) as c:
        listed = await c.get("/velo/requests", headers=alice)
        assert listed.status == 403 and "admin_keys" in (await listed.json())["error"]
        assert (await c.delete("/velo/requests/req_x", headers=alice)).status == 403
        page = await c.get("/ui/state", headers=alice)
        assert page.status == 401 and "admin" in await page.text() and "WWW-Authenticate" in page.headers
        assert (await c.get("/v1/models", headers=alice)).status == 200
        for path in ("/velo/requests", "/ui/state", "/v1/models"):
            assert (await c.get(path, headers=root)).status == 200, path
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer sk-nobody"})).status == 401


async def listed_by(c: TestClient, key: str, count: int) -> list[str]:
    """The ids `key` lists once it lists `count` requests that produced tokens."""
    for _ in range(200):
        listed = (await (await c.get("/velo/requests", headers={"Authorization": f"Bearer {key}"})).json())["requests"]
        if len([r for r in listed if r["tokens"] > 0]) >= count:
            return [r["id"] for r in listed]
        await asyncio.sleep(0.02)
    raise AssertionError(f"{key} never listed {count} running requests")


async def test_a_key_lists_only_its_own_requests_in_flight_and_an_admin_all() -> None:
    """Where api_keys are set and no admin_keys, any key listed every key's requests: the route, the models and the
    client of each (no request sees another key's data). An admin, where admin_keys are set, lists them all."""
    for admins in ([], ["sk-root"]):
        config = Config(server=ServerConfig(api_keys=["sk-alice", "sk-bob"], admin_keys=admins),
                        cache=CacheConfig(enabled=False))
        async with TestClient(TestServer(make_app(config, {"s": runaway()}), handler_cancellation=True)) as c:
            alice = await c.post("/api/chat", json=CHAT, headers={"Authorization": "Bearer sk-alice"})
            bob = await c.post("/api/chat", json=CHAT, headers={"Authorization": "Bearer sk-bob"})
            ids = {"sk-alice": alice.headers["X-Velo-Request-Id"], "sk-bob": bob.headers["X-Velo-Request-Id"]}
            if admins:
                assert sorted(await listed_by(c, "sk-root", 2)) == sorted(ids.values())
            else:
                assert await listed_by(c, "sk-alice", 1) == [ids["sk-alice"]]
                assert await listed_by(c, "sk-bob", 1) == [ids["sk-bob"]]
            alice.close()
            bob.close()


async def test_a_key_cancels_only_its_own_requests_and_an_admin_any() -> None:
    """Where api_keys are set and no admin_keys, any key could end any other key's request by its id. Another key's
    id now answers as an unknown one does, so a key cannot tell from the answer that the id is running."""
    for admins in ([], ["sk-root"]):
        config = Config(server=ServerConfig(api_keys=["sk-alice", "sk-bob"], admin_keys=admins),
                        cache=CacheConfig(enabled=False))
        async with TestClient(TestServer(make_app(config, {"s": runaway()}), handler_cancellation=True)) as c:
            keys = {k: {"Authorization": f"Bearer {k}"} for k in ("sk-alice", "sk-bob", "sk-root")}
            alice = await c.post("/api/chat", json=CHAT, headers=keys["sk-alice"])
            bob = await c.post("/api/chat", json=CHAT, headers=keys["sk-bob"])
            ids = {"sk-alice": alice.headers["X-Velo-Request-Id"], "sk-bob": bob.headers["X-Velo-Request-Id"]}
            for key, count in [("sk-root", 2)] if admins else [(k, 1) for k in ids]:
                await listed_by(c, key, count)
            if admins:
                for key in ids:
                    assert (await c.delete(f"/velo/requests/{ids[key]}", headers=keys["sk-root"])).status == 200
            else:
                unknown = await c.delete("/velo/requests/req_0123456789abcdef", headers=keys["sk-alice"])
                theirs = await c.delete(f"/velo/requests/{ids['sk-bob']}", headers=keys["sk-alice"])
                assert theirs.status == unknown.status == 404
                said = (await theirs.text()).replace(ids["sk-bob"], "req_0123456789abcdef")
                assert said == await unknown.text()
                assert await listed_by(c, "sk-bob", 1) == [ids["sk-bob"]]  # still running
                for key in ids:
                    assert (await c.delete(f"/velo/requests/{ids[key]}", headers=keys[key])).status == 200
            for resp in (alice, bob):  # a key that cancelled its own was told an administrator had
                tail = (await asyncio.wait_for(resp.read(), 10)).decode().strip().splitlines()[-1]
                assert ("cancelled by an administrator" if admins else "cancelled by its own key") in tail


async def test_the_list_and_the_log_never_show_a_callers_key(caplog) -> None:
    """An admin reads every key's requests in flight: the list named each request's client by its raw API key, so
    whoever read it read every other user's key there (and in the long-request log line)."""
    caplog.set_level(logging.WARNING, logger="velo.requests")
    config = Config(server=ServerConfig(api_keys=["sk-alice-secret"], admin_keys=["sk-bob"], long_request_s=0.1),
                    cache=CacheConfig(enabled=False))
    app = make_app(config, {"s": runaway()})
    async with TestClient(TestServer(app, handler_cancellation=True)) as c:
        alice = await c.post("/api/chat", json=CHAT, headers={"Authorization": "Bearer sk-alice-secret"})
        for _ in range(200):
            listed = await (await c.get("/velo/requests", headers={"Authorization": "Bearer sk-bob"})).text()
            if "/api/chat" in listed and caplog.records:
                break
            await asyncio.sleep(0.02)
        alice.close()
    assert '"client":"key:key1"' in listed and "sk-alice" not in listed
    hashed = tenant_of("sk-alice-secret")  # a weak key is guessed offline from its hash
    assert hashed not in listed
    assert caplog.records and not any("sk-alice" in r.getMessage() or hashed in r.getMessage()
                                      for r in caplog.records)


async def test_a_name_a_client_gives_itself_comes_after_its_keys_scope() -> None:
    """`X-Velo-Client: key:key1` (another key's label) listed the request as that key's, and shared its place in a
    backend's queue."""
    config = Config(server=ServerConfig(api_keys=["sk-alice", "sk-bob"]), cache=CacheConfig(enabled=False))
    app = make_app(config, {"s": runaway()})
    alice = "key:key1"
    async with TestClient(TestServer(app, handler_cancellation=True)) as c:
        bob = await c.post("/api/chat", json=CHAT, headers={"Authorization": "Bearer sk-bob", "X-Velo-Client": alice})
        for _ in range(200):
            listed = await (await c.get("/velo/requests", headers={"Authorization": "Bearer sk-bob"})).json()
            if listed["requests"]:
                break
            await asyncio.sleep(0.02)
        bob.close()
    assert [r["client"] for r in listed["requests"]] == [f"key:key2/{alice}"]


async def test_a_long_request_is_logged_once_with_its_id_and_tokens(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="velo.requests")
    app = make_app(Config(server=ServerConfig(long_request_s=0.2), cache=CacheConfig(enabled=False)),
                   {"s": ScriptedBackend("s", script=Script(pieces=["tok "] * 60, delay=0.01))})
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/api/chat", json=CHAT)
        lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    assert lines[-1]["done"] is True
    logged = [r.getMessage() for r in caplog.records if "has run" in r.getMessage()]
    assert len(logged) == 1 and resp.headers["X-Velo-Request-Id"] in logged[0] and "tiny" in logged[0]


@pytest.mark.parametrize("path,body,end", [
    ("/api/chat", CHAT, b'"done":true'),
    ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
     b'"finish_reason":"stop"'),
    ("/v1/messages", {**CHAT, "max_tokens": 90, "stream": True}, b"event: message_stop"),
    ("/v1/responses", {"model": "tiny", "input": "hi", "stream": True}, b"event: response.completed")])
async def test_a_cancel_after_the_answer_ended_ends_the_stream_without_an_error(path: str, body: dict,
                                                                                end: bytes) -> None:
    """An admin's cancel while the pipeline still works after the answer (the cache's store; here the backend's
    stream open past its finishing chunk) wrote its error event after the answer's end, which the SDKs raise. The
    usage chunk an OpenAI client asked for still comes."""
    from tests.proxy.test_stream_faults import stream_error
    backend = ScriptedBackend("s", script=Script(after_finish=5.0))
    app = make_app(Config(cache=CacheConfig(enabled=False)), {"s": backend})
    async with TestClient(TestServer(app, handler_cancellation=True)) as c:
        resp = await c.post(path, json=body)
        raw = b""
        while end not in raw:  # the answer is out; its stream is still open
            raw += await asyncio.wait_for(resp.content.readany(), 10)
        assert (await c.delete(f"/velo/requests/{resp.headers['X-Velo-Request-Id']}")).status == 200
        raw += await asyncio.wait_for(resp.read(), 10)
    assert stream_error(path, raw) is None and b"cancelled by an administrator" not in raw
    if "include_usage" in str(body):
        assert b'"usage":{' in raw.partition(end)[2] and raw.endswith(b"data: [DONE]\n\n")
