"""Llama-servers that Velo runs itself, with the real llama-server and two GGUFs (the shipped SmolLM2 under two
names): started on the first request, swapped when only one may run without cutting the stream in flight,
stopped after ttl_s idle; waits and swaps on /metrics."""
from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import datetime

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.llamacpp_managed import embedding_batch
from proxy.app import make_app
from proxy.config import parse_config
from proxy.state import GENERATIONS
from tests.llama_server import binary, model_path
from tests.proxy.test_metrics import scrape, value

pytestmark = pytest.mark.slow
COUNT = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]


def managed(tmp_path, ttl_s: float, max_loaded: int = 1, names=("first", "second")) -> dict:
    backends = []
    for name in names:
        gguf = tmp_path / f"{name}.gguf"
        if not gguf.exists():
            os.symlink(model_path(), gguf)
        backends.append({"name": name, "kind": "llamacpp", "model": str(gguf), "ttl_s": ttl_s,
                         "max_loaded": max_loaded, "first_token_timeout": 60.0,
                         "command": [binary(), "-c", "1024", "-np", "2", "-t", "1", "-tb", "1"]})
    return {"backends": backends, "cache": {"enabled": False}}


def client(raw: dict) -> TestClient:
    return TestClient(TestServer(make_app(parse_config(raw)), handler_cancellation=True))


async def test_a_swap_waits_for_the_stream_in_flight_and_never_cuts_it(tmp_path):
    async with client(managed(tmp_path, ttl_s=0)) as c:
        first, second = (c.server.app[GENERATIONS].current.backends[n] for n in ("first", "second"))
        tags = await (await c.get("/api/tags")).json()
        assert sorted(m["name"] for m in tags["models"]) == ["first:latest", "second:latest"]
        assert first.process is None and second.process is None  # listing starts nothing
        stream = await c.post("/api/chat", json={"model": "first", "messages": COUNT, "stream": True,
                                                 "options": {"temperature": 0, "num_predict": 120}})
        assert stream.status == 200
        lines = [json.loads(await stream.content.readline())]
        assert first.state == "ready" and first.process is not None
        other = asyncio.create_task(c.post("/api/chat", json={
            "model": "second", "messages": [{"role": "user", "content": "Hi"}], "stream": False,
            "options": {"temperature": 0, "num_predict": 5}}))
        for _ in range(100):
            if value(await scrape(c), "velo_managed_waiting", backend="second") == 1:
                break
            await asyncio.sleep(0.02)
        found = await scrape(c)
        assert value(found, "velo_managed_waiting", backend="second") == 1  # queued behind the stream
        assert value(found, "velo_managed_state", backend="first", model="first", state="ready") == 1
        assert value(found, "velo_managed_in_flight", backend="first") == 1
        lines += [json.loads(line) async for line in stream.content if line.strip()]
        assert lines[-1]["done"] is True and "error" not in lines[-1]  # the stream ran to its end
        assert len("".join(x["message"]["content"] for x in lines)) > 20
        answer = await other
        assert answer.status == 200 and (await answer.json())["done"] is True
        assert second.state == "ready" and first.state == "stopped" and first.process is None
        found = await scrape(c)
        assert value(found, "velo_managed_swaps_total", backend="first") == 1
        assert value(found, "velo_managed_starts_total", backend="second") == 1
        assert value(found, "velo_managed_wait_seconds_total", backend="second") > 0
        ps = await (await c.get("/api/ps")).json()
        assert [m["name"] for m in ps["models"]] == ["second:latest"]


async def test_an_idle_server_stops_after_its_ttl_and_starts_again_on_demand(tmp_path):
    """The ttl outlasts the two servers' starts ending apart (1.6 s under load), or one stopped before /api/ps."""
    ttl = 3.0
    async with client(managed(tmp_path, ttl_s=ttl, max_loaded=2)) as c:
        backends = c.server.app[GENERATIONS].current.backends
        ask = [c.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "Hi"}],
                                                    "max_tokens": 3}) for name in ("first", "second")]
        assert [r.status for r in await asyncio.gather(*ask)] == [200, 200]  # two may run at once: no swap
        ps, tags = [await (await c.get(path)).json() for path in ("/api/ps", "/api/tags")]
        assert {m["name"]: m["digest"] for m in ps["models"]} == {m["name"]: m["digest"] for m in tags["models"]}
        for m in ps["models"]:  # it unloads after ttl_s, not never; its size and details are the file's
            expires = datetime.fromisoformat(m["expires_at"].replace("Z", "+00:00")).timestamp()
            assert 0 < expires - time.time() < ttl + 1 and m["size"] > 90e6 and m["details"]["family"]
        found = await scrape(c)
        assert value(found, "velo_managed_swaps_total", backend="first") == 0
        served = await (await c.post("/api/show", json={"model": "first"})).json()
        for _ in range(100):
            if all(b.state == "stopped" for b in backends.values()):
                break
            await asyncio.sleep(0.1)
        assert all(b.state == "stopped" and b.process is None for b in backends.values())
        shown = await (await c.post("/api/show", json={"model": "first"})).json()
        assert shown["model_info"]["llama.block_count"] == 30  # from the file: showing never starts it
        # the window its server gave (-c 1024 over 2 slots), as when it ran, not the file's 8,192
        window = served["model_info"]["llama.context_length"]
        assert window < 8192 and shown["model_info"]["llama.context_length"] == window
        assert shown["parameters"].split("\n")[0].split() == ["num_ctx", str(window)]
        assert all(b.state == "stopped" for b in backends.values())
        again = await c.post("/v1/chat/completions", json={"model": "first", "max_tokens": 3,
                                                           "messages": [{"role": "user", "content": "Hi"}]})
        assert again.status == 200
        assert value(await scrape(c), "velo_managed_starts_total", backend="first") == 2


async def test_a_long_chat_to_a_server_not_yet_started_is_fitted_to_the_window_it_serves(tmp_path):
    """Before its first start a managed server's window is unknown (its flags and llama.cpp decide it), so a long
    chat went to it unfitted: llama-server's 400 where Ollama drops the start of the turn, and so for the 30 s the
    model's facts from before the start were kept."""
    long = " ".join(["river"] * 700)  # over the 512-token slot (-c 1024 over 2)
    async with client(managed(tmp_path, ttl_s=60, names=("first",))) as c:
        for _ in range(2):
            resp = await c.post("/api/chat", json={"model": "first", "stream": False, "options": {"num_predict": 2},
                                                   "messages": [{"role": "user", "content": long}]})
            assert resp.status == 200, await resp.text()
            assert "characters of the last" in resp.headers["X-Velo-Context-Trimmed"]
        assert value(await scrape(c), "velo_managed_starts_total", backend="first") == 1


async def test_a_server_that_dies_is_started_again_by_the_next_request(tmp_path):
    """A crash (or the OOM killer) left the dead server "ready": every request got a 503 until ttl_s passed with no
    request at all. Its exit now marks it stopped, and the next request starts it again."""
    async with client(managed(tmp_path, ttl_s=0, names=("first",))) as c:
        first = c.server.app[GENERATIONS].current.backends["first"]
        hi = {"model": "first", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}
        assert (await c.post("/v1/chat/completions", json=hi)).status == 200
        first.process.kill()
        for _ in range(100):
            if first.state == "stopped":
                break
            await asyncio.sleep(0.05)
        again = await c.post("/v1/chat/completions", json=hi)
        assert again.status == 200, await again.text()
        assert value(await scrape(c), "velo_managed_starts_total", backend="first") == 2


async def test_a_server_that_cannot_start_is_a_clear_503(tmp_path):
    raw = managed(tmp_path, ttl_s=0, names=("first",))
    raw["backends"][0]["command"] = [binary(), "--no-such-flag"]
    async with client(raw) as c:
        resp = await c.post("/v1/chat/completions", json={"model": "first", "max_tokens": 3,
                                                          "messages": [{"role": "user", "content": "Hi"}]})
        body = await resp.json()
        assert resp.status == 503 and "llama-server exited" in body["error"]["message"]
        assert (await (await c.get("/ready")).json())["backends"] == {"first": False}
        again = await c.post("/v1/messages", json={"model": "first", "max_tokens": 3,
                                                   "messages": [{"role": "user", "content": "Hi"}]})
        said = (await again.json())["error"]["message"]
        assert again.status == 529 and said.count("--no-such-flag") == 1, said


async def test_a_managed_embedding_server_embeds_what_ollama_would_whole(tmp_path):
    """Ollama runs an embedding model with a batch of min(2048, its context); llama-server's default 512 cut a
    1,580-token retrieval chunk (Dify) or refused it (n8n's and Flowise's truncate false). A command that sets its
    own batch keeps it."""
    gguf = tmp_path / "emb.gguf"
    os.symlink(model_path(), gguf)
    command = [binary(), "-c", "1024", "-np", "1", "-t", "1", "-tb", "1", "--embeddings", "--pooling", "mean"]
    assert embedding_batch(command) == ["-b", "1024", "-ub", "1024"]
    assert embedding_batch([*command, "-ub", "256"]) == [] and embedding_batch(command[:-3]) == []
    raw = {"backends": [{"name": "emb", "kind": "llamacpp", "model": str(gguf), "command": command,
                         "first_token_timeout": 60.0}], "cache": {"enabled": False}}
    async with client(raw) as c:
        tags = await (await c.get("/api/tags")).json()
        assert tags["models"][0]["capabilities"] == ["embedding"]  # it embeds and does nothing else
        resp = await c.post("/api/embed", json={"model": "emb", "input": "word " * 700, "truncate": False})
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["prompt_eval_count"] > 700
