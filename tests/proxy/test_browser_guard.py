"""Browsers get what Ollama gives them: CORS for local and configured origins, 403 for foreign pages and for
foreign host names while bound to loopback."""
from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import make_app
from proxy.browser_guard import OriginPolicy
from proxy.config import Config, ServerConfig
from tests.scripted import ScriptedBackend

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def config() -> Config:
    return Config(server=ServerConfig(origins=["https://*.example.org"]))


def preflight(origin: str) -> dict[str, str]:
    return {"Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,authorization"}


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1", "vscode-webview://abc123",
                                    "vscode-file://vscode-app", "https://app.example.org"])
async def test_allowed_origins_pass_preflight_and_streams_carry_the_headers(client, scripted, origin):
    resp = await client.options("/api/chat", headers=preflight(origin))
    assert resp.status == 204 and scripted.requests == []
    assert resp.headers["Access-Control-Allow-Origin"] == origin
    allowed = resp.headers["Access-Control-Allow-Headers"].lower().split(",")
    assert {"content-type", "authorization"} <= set(allowed) and "POST" in resp.headers["Access-Control-Allow-Methods"]
    bare = await client.options("/api/tags", headers={"Origin": origin})  # not a preflight: gin answers it too
    assert bare.status == 204 and bare.headers["Access-Control-Allow-Origin"] == origin
    resp = await client.post("/api/chat", json=CHAT, headers={"Origin": origin})  # an NDJSON stream
    assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == origin
    assert "X-Velo-Cache" in resp.headers["Access-Control-Expose-Headers"] and "Origin" in resp.headers["Vary"]
    assert b'"done":true' in await resp.read()


async def test_a_page_can_use_the_anthropic_sdk_and_read_every_header_velo_sends(client):
    """Anthropic's SDK in a browser sends its own headers, which a preflight must allow (LobeChat); and what Velo
    says in its headers (X-Velo-Tools, X-Velo-Token-Count, ...) is for scripts too."""
    origin = "http://localhost:3210"
    sdk = "anthropic-version,anthropic-beta,anthropic-dangerous-direct-browser-access,x-api-key,content-type"
    resp = await client.options("/v1/messages", headers={**preflight(origin), "Access-Control-Request-Headers": sdk})
    assert set(sdk.split(",")) <= set(resp.headers["Access-Control-Allow-Headers"].lower().split(","))
    # the JS SDKs' tool runner (x-stainless-helper), and an OpenAI client with its organization and project set
    sdk = "x-stainless-helper,openai-organization,openai-project,authorization,content-type"
    resp = await client.options("/v1/chat/completions", headers={**preflight(origin),
                                                                 "Access-Control-Request-Headers": sdk})
    assert set(sdk.split(",")) <= set(resp.headers["Access-Control-Allow-Headers"].lower().split(","))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    resp = await client.post("/v1/chat/completions", json={**CHAT, "tools": [tool]}, headers={"Origin": origin})
    exposed = resp.headers["Access-Control-Expose-Headers"].split(",")
    sent = [h for h in resp.headers if h.lower().startswith("x-velo-")]
    assert "X-Velo-Tools" in sent and set(sent) <= set(exposed)
    resp = await client.post("/v1/messages/count_tokens", headers={"Origin": origin},
                             json={"model": "tiny", "messages": CHAT["messages"]})
    assert "X-Velo-Token-Count" in resp.headers and "X-Velo-Token-Count" in exposed


async def test_a_page_may_send_the_headers_velo_reads(client):
    """X-Velo-Client (the fair queue's client, an autocomplete's place) and Pragma (a cache bypass, as in
    config.example.toml) failed a page's preflight: the browser sent none of its requests."""
    asked = "x-velo-client,pragma,x-velo-cache,cache-control,content-type"
    resp = await client.options("/api/chat", headers={**preflight("http://localhost:5173"),
                                                      "Access-Control-Request-Headers": asked})
    assert set(asked.split(",")) <= set(resp.headers["Access-Control-Allow-Headers"].lower().split(","))


@pytest.mark.parametrize("path, body, shape", [
    ("/api/chat", CHAT, lambda b: isinstance(b["error"], str)),
    ("/v1/chat/completions", CHAT, lambda b: b["error"]["type"] == "permission_error")])
async def test_a_foreign_page_is_refused_before_anything_runs(client, scripted, path, body, shape):
    for send in (client.options(path, headers=preflight("https://evil.example")),
                 client.post(path, json=body, headers={"Origin": "https://evil.example"}),
                 client.post(path, data=b"{}", headers={"Origin": "https://evil.example",
                                                        "Content-Type": "text/plain"})):  # no preflight needed
        resp = await send
        assert resp.status == 403 and "Access-Control-Allow-Origin" not in resp.headers
        assert shape(await resp.json()) and "evil.example" in str(await resp.json())
    assert scripted.requests == []


async def test_no_origin_and_same_origin_are_not_cors(client):
    resp = await client.post("/api/chat", json=CHAT)  # curl, SDKs, servers
    assert resp.status == 200 and "Access-Control-Allow-Origin" not in resp.headers
    own = f"http://{client.server.host}:{client.server.port}"
    assert (await client.post("/api/chat", json=CHAT, headers={"Origin": own})).status == 200


async def test_ollama_origins_from_the_environment(monkeypatch):
    monkeypatch.setenv("OLLAMA_ORIGINS", "chrome-extension://abc, https://ui.test")
    app = make_app(Config(), {"scripted": ScriptedBackend()})
    async with TestClient(TestServer(app)) as c:
        for origin, status in [("chrome-extension://abc", 204), ("https://ui.test", 204), ("https://other.test", 403)]:
            assert (await c.options("/v1/models", headers=preflight(origin))).status == status


@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1:8000", True), ("localhost:8000", True), ("[::1]:8000", True), ("192.168.1.20:8000", True),
    ("box.local", True), ("dev.localhost:8000", True), ("", True),
    ("evil.example:8000", False), ("8.8.8.8", False), ("localhost.evil.example", False)])
def test_host_names_answered_while_bound_to_loopback(host, ok):
    assert OriginPolicy.for_server("127.0.0.1", []).host_allowed(host) is ok
    assert OriginPolicy.for_server("0.0.0.0", []).check_host is False  # reachable by any name, by choice


async def test_dns_rebinding_host_is_refused(client, scripted):
    resp = await client.post("/api/chat", json=CHAT, headers={"Host": "evil.example:8000"})
    assert resp.status == 403 and "evil.example" in (await resp.json())["error"]
    assert scripted.requests == []


async def test_an_anthropic_client_refused_here_gets_its_request_id_in_the_body(client):
    """Every other Anthropic error names the request's id in its body, as Anthropic's do; the guard's two did not."""
    message = {"model": "tiny", "max_tokens": 5, "messages": CHAT["messages"]}
    for headers in ({"Origin": "https://evil.example"}, {"Host": "evil.example:8000"}):
        resp = await client.post("/v1/messages", json=message, headers=headers)
        body = await resp.json()
        assert resp.status == 403 and body["error"]["type"] == "permission_error"
        assert body["request_id"] == resp.headers["request-id"] == resp.headers["X-Velo-Request-Id"]
