"""Naming servers by their answers, and the config.toml written for them."""
from __future__ import annotations

import socket
import tomllib
from contextlib import asynccontextmanager
from typing import AsyncIterator

import pytest
from aiohttp import web

from proxy.commands.config_toml import render_config
from proxy.commands.servers import Answer, Server, find_servers, identify
from proxy.config import parse_config


def _answers(**by_path: Answer) -> dict[str, Answer]:
    paths = ("/", "/api/version", "/api/tags", "/props", "/v1/models", "/metrics")
    return {p: by_path.get(p.strip("/").replace("/", "_") or "root", Answer(404)) for p in paths}


def test_openai_servers_are_named_by_owner_then_port():
    listing = Answer(200, b'{"object":"list","data":[{"id":"Qwen/Qwen3-8B","owned_by":"vllm"}]}')
    assert identify(9999, "u", _answers(v1_models=listing)).product == "vLLM"
    anonymous = Answer(200, b'{"object":"list","data":[{"id":"m","owned_by":"me"}]}')
    assert identify(1234, "u", _answers(v1_models=anonymous)).product == "LM Studio"
    assert identify(9999, "u", _answers(v1_models=anonymous)).product == "OpenAI API"


def test_a_velo_is_told_from_ollama_by_its_metrics():
    root = Answer(200, b"Ollama is running")
    ollama = identify(11434, "u", _answers(root=root, api_version=Answer(200, b'{"version":"0.12.6"}')))
    velo = identify(11434, "u", _answers(root=root, metrics=Answer(200, b"# HELP velo_requests_total ...")))
    assert (ollama.kind, ollama.version, velo.kind) == ("ollama", "0.12.6", "velo")


async def test_a_web_server_that_is_no_model_server():
    async def blog(request: web.Request) -> web.Response:
        return web.Response(text="<html>my blog</html>")
    app = web.Application()
    app.router.add_get("/", blog)
    async with _serving(app, "127.0.0.1") as port:
        (server,) = await find_servers(ports=[port])
    assert server.kind == "unknown" and "none of the model-server APIs" in server.note
    assert "[[backends]]" in render_config([server], []) and 'kind = "engine"' in render_config([server], [])


def test_a_server_on_velos_port_moves_velo():
    vllm = Server(8000, "http://127.0.0.1:8000", "openai", "vLLM", ["Qwen/Qwen3-8B"])
    text = render_config([vllm], [])
    cfg = parse_config(tomllib.loads(text))
    assert cfg.server.port != 8000 and [b.name for b in cfg.backends] == ["vllm"]
    with socket.socket() as s:  # the port it picked was free when it looked
        s.bind(("127.0.0.1", cfg.server.port))


def test_a_llama_server_of_one_slot_is_said_so():
    """`llama-server -np 1`, the usual single-user start, was "(1 slots of 4096 tokens)"."""
    one = Server(8080, "http://127.0.0.1:8080", "llamacpp", "llama-server", ["m"], "b1", slots=1, context=4096)
    assert "serves: m (1 slot of 4096 tokens)" in render_config([one], [])


def test_two_servers_of_a_kind_get_distinct_names():
    a = Server(8000, "http://127.0.0.1:8000", "openai", "OpenAI API")
    b = Server(8001, "http://127.0.0.1:8001", "openai", "OpenAI API")
    velo = Server(8002, "http://127.0.0.1:8002", "velo", "Velo")
    cfg = parse_config(tomllib.loads(render_config([a, b, velo], [])))
    assert [b.name for b in cfg.backends] == ["openai-api", "openai-api-8001"]


async def test_an_ipv6_host_is_probed():
    """`--host ::1` made no URL (no brackets), and every port read as nothing there."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:  # a machine without IPv6 loopback has no such server to find
        pytest.skip("no IPv6 loopback on this machine")

    async def tags(request: web.Request) -> web.Response:
        return web.json_response({"models": []})
    app = web.Application()
    app.router.add_get("/api/tags", tags)
    async with _serving(app, "::1") as port:
        (server,) = await find_servers(host="::1", ports=[port])
    assert server.url.startswith("http://[::1]:")


@asynccontextmanager
async def _serving(app: web.Application, host: str) -> AsyncIterator[int]:
    """`app` on a free port of `host`: the port."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
