"""Client disconnects, authentication and tenant scoping, health endpoints."""
from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from proxy.app import make_app
from proxy.config import Config, ServerConfig
from tests.scripted import Script, ScriptedBackend


async def test_client_disconnect_cancels_backend_stream():
    backend = ScriptedBackend(script=Script(pieces=["x"] * 200, delay=0.02))
    app = make_app(Config(), {"s": backend})
    async with TestClient(TestServer(app, handler_cancellation=True)) as c:
        resp = await c.post("/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
        await resp.content.readline()
        resp.close()
        for _ in range(100):
            if backend.cancelled:
                break
            await asyncio.sleep(0.02)
    assert backend.cancelled == 1 and backend.completed == 0


async def test_api_keys_required_when_configured():
    app = make_app(Config(server=ServerConfig(api_keys=["k1"])), {"s": ScriptedBackend()})
    async with TestClient(TestServer(app)) as c:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": False}
        assert (await c.post("/api/chat", json=body)).status == 401
        denied = await c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer wrong"})
        assert denied.status == 401 and (await denied.json())["error"] == {  # OpenAI's: clients test the code
            "message": "invalid or missing API key", "type": "invalid_request_error", "param": None,
            "code": "invalid_api_key"}
        ok = await c.post("/api/chat", json=body, headers={"Authorization": "Bearer k1"})
        assert ok.status == 200
        assert (await c.get("/health")).status == 200  # probes need no key


async def test_ready_reports_backend_health():
    backend = ScriptedBackend()
    app = make_app(Config(), {"s": backend})
    async with TestClient(TestServer(app)) as c:
        assert (await (await c.get("/ready")).json())["backends"] == {"s": True}

        async def down() -> bool:
            return False
        backend.health = down  # type: ignore[method-assign]
        resp = await c.get("/ready")
        assert resp.status == 503 and (await resp.json())["status"] == "unavailable"
