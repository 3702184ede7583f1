"""Upstream faults after the first streamed byte, through every generation endpoint of every dialect, against both
kinds of fake upstream: the stream ends with the dialect's own error and its proper end, never with a second HTTP
response written into it (before: `HTTP/1.1 500` inside the stream, and a socket held open for 100 s and more).
And answers of the wrong shape that are the upstream's fault: 502 naming it, never a 500."""
from __future__ import annotations

import asyncio

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config
from tests.fakes import FakeOpenAI, FakeServer, OllamaDouble

HANG_S = 10  # a hang detector: the old code left such streams open for 100 s and more
MESSAGES = [{"role": "user", "content": "hi"}]
REQUESTS = {  # path -> a streamed request in that dialect
    "/api/chat": {"model": "m", "messages": MESSAGES},
    "/api/generate": {"model": "m", "prompt": "hi"},
    "/v1/chat/completions": {"model": "m", "messages": MESSAGES, "stream": True},
    "/v1/completions": {"model": "m", "prompt": "hi", "stream": True},
    "/v1/messages": {"model": "m", "max_tokens": 50, "messages": MESSAGES, "stream": True},
    "/v1/responses": {"model": "m", "input": "hi", "stream": True},
}
MALFORMED = {  # upstream kind -> events that are valid framing but not what the API promises
    "openai": [b'data: {"choices": [{"index": 0, "delta": {"content": 5}}]}\n\n', b"data: [1, 2]\n\n",
               b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"function": {"name": 7}}]}}]}\n\n'],
    "ollama": [b'{"message": "oops", "done": false}\n', b"[1]\n",
               b'{"message": {"content": "", "tool_calls": [{"function": {"name": "f", "arguments": "x"}}]}}\n'],
}


def upstream(kind: str) -> FakeServer:
    return FakeOpenAI(models=["m"]) if kind == "openai" else OllamaDouble(models=["m"])


def velo(kind: str, url: str) -> TestClient:
    config = Config(backends=[BackendConfig(name="up", kind=kind, urls=[url])], default_backend="up",
                    cache=CacheConfig(enabled=False))
    return TestClient(TestServer(make_app(config), handler_cancellation=True))


def stream_error(path: str, body: bytes) -> str | None:
    """The error message a whole stream ended with, in the dialect's own shape, or None when it ended well."""
    text = body.decode()
    assert "HTTP/1.1" not in text, text[-500:]
    if path.startswith("/api/"):
        return orjson.loads(body.splitlines()[-1]).get("error")
    last = [e for e in text.split("\n\n") if e.strip()][-1]
    if path == "/v1/messages":
        failed = last.startswith("event: error\n")
        return orjson.loads(last.split("data: ", 1)[1])["error"]["message"] if failed else None
    if path == "/v1/responses":
        failed = last.startswith("event: response.failed\n")
        return orjson.loads(last.split("data: ", 1)[1])["response"]["error"]["message"] if failed else None
    if last == "data: [DONE]":
        return None
    return orjson.loads(last.removeprefix("data: "))["error"]["message"]


@pytest.mark.parametrize("kind", ["openai", "ollama"])
@pytest.mark.parametrize("path", list(REQUESTS))
async def test_a_malformed_event_mid_stream_ends_it_with_the_dialects_error(kind: str, path: str) -> None:
    async with upstream(kind) as up, velo(kind, up.url) as c:
        up.script.reply = "one two three four five six"
        for bad in MALFORMED[kind]:
            up.script.malformed = bad
            resp = await c.post(path, json=REQUESTS[path])
            body = await asyncio.wait_for(resp.read(), HANG_S)
            assert resp.status == 200, body[:300]
            message = stream_error(path, body)
            assert message is not None and "unexpected shape" in message, message
        up.script.malformed = None
        after = await c.post(path, json=REQUESTS[path])  # the same pooled connection still serves
        assert after.status == 200 and stream_error(path, await after.read()) is None


@pytest.mark.parametrize("path", list(REQUESTS))
async def test_ollamas_error_line_mid_stream_names_the_backend(path: str) -> None:
    """Ollama ends a stream whose runner died with an `error` line (server/routes.go); Velo said "ollama failed
    mid-stream: ...", naming no backend, where every other backend's failure names it (with several Ollama servers, or
    replicas of one, the client could not tell which had failed)."""
    async with upstream("ollama") as up, velo("ollama", up.url) as c:
        up.script.reply = "one two three four five six"
        up.script.malformed = b'{"error": "llama runner process has terminated: exit status 2"}\n'
        resp = await c.post(path, json=REQUESTS[path])
        message = stream_error(path, await asyncio.wait_for(resp.read(), HANG_S))
        assert message == "backend 'up' failed mid-stream: llama runner process has terminated: exit status 2"


@pytest.mark.parametrize("kind,path,answer", [
    ("openai", "/v1/embeddings", {"object": "list", "data": [{"index": 0}]}),
    ("openai", "/api/embed", {"object": "list", "data": [{"index": 0, "embedding": None}]}),
    ("ollama", "/api/embed", {"model": "m", "embeddings": "no"}),
    ("ollama", "/v1/embeddings", {"model": "m"}),
])
async def test_an_answer_of_the_wrong_shape_is_a_502_naming_the_backend(kind: str, path: str, answer: dict) -> None:
    async with upstream(kind) as up, velo(kind, up.url) as c:
        up.script.answer = answer
        resp = await c.post(path, json={"model": "m", "input": "hello"})
        body = await resp.json()
        message = body["error"] if path.startswith("/api/") else body["error"]["message"]
        assert resp.status == 502 and "backend 'up'" in message and "unexpected shape" in message, body


# How a server writes a vector that is not all finite numbers, and what Velo's 502 then says
NON_FINITE = {"null": ([0.5, None], "not a finite number"),  # llama-server's nlohmann::json writes NaN and Inf so
              "NaN": ([0.5, float("nan")], "invalid JSON")}  # Python's json.dumps: a literal NaN


@pytest.mark.parametrize("kind", ["openai", "ollama"])
@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed", "/api/embeddings"])
@pytest.mark.parametrize("written", list(NON_FINITE))
async def test_a_vector_not_all_finite_numbers_is_the_backends_502_in_every_dialect(kind: str, path: str,
                                                                                    written: str) -> None:
    """Ollama refuses such a vector itself (server/routes.go, normalize); Velo passed the nulls on (and answered
    base64, which the openai client asks for by default, with a 500)."""
    vector, said = NON_FINITE[written]
    async with upstream(kind) as up, velo(kind, up.url) as c:
        up.script.answer = {"object": "list", "data": [{"index": 0, "embedding": vector}]} if kind == "openai" \
            else {"model": "m", "embeddings": [vector], "embedding": vector}  # /api/embed's, legacy /api/embeddings'
        for encoding in ("float", "base64"):
            asked = {"prompt": "hello"} if path == "/api/embeddings" else {"input": "hello"}
            resp = await c.post(path, json={"model": "m", "encoding_format": encoding, **asked})
            body = await resp.json()
            message = body["error"] if path.startswith("/api/") else body["error"]["message"]
            assert resp.status == 502 and "backend 'up'" in message and said in message, body
            assert written != "null" or resp.headers["x-should-retry"] == "false"  # the same input embeds the same


@pytest.mark.parametrize("kind", ["openai", "ollama"])
@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed"])
async def test_fewer_vectors_than_inputs_is_the_backends_502_in_a_request_too_large_to_batch(kind: str,
                                                                                            path: str) -> None:
    """A request of `embed_max_inputs` (64) inputs or more goes to the backend alone, past the batch's check that
    each input has its vector: 69 vectors for 70 inputs went out as a 200, the last input without one."""
    async with upstream(kind) as up, velo(kind, up.url) as c:
        vectors = [[0.6, 0.8]] * 69
        up.script.answer = {"object": "list", "data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]} \
            if kind == "openai" else {"model": "m", "embeddings": vectors}
        resp = await c.post(path, json={"model": "m", "input": [f"chunk {i}" for i in range(70)]})
        body = await resp.json()
        message = body["error"] if path.startswith("/api/") else body["error"]["message"]
        assert resp.status == 502 and message == "backend 'up' returned 69 embeddings for 70 inputs", body


@pytest.mark.parametrize("kind", ["openai", "ollama"])
@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed"])
async def test_a_batched_request_given_no_vectors_names_the_backend(kind: str, path: str) -> None:
    """A request small enough to be batched was told "backend returned 0 embeddings for 1 input", naming no backend
    where a request too large to batch names it; with several backends the client could not tell which failed."""
    async with upstream(kind) as up, velo(kind, up.url) as c:
        up.script.answer = {"object": "list", "data": []} if kind == "openai" else {"model": "m", "embeddings": []}
        resp = await c.post(path, json={"model": "m", "input": "hello"})
        body = await resp.json()
        message = body["error"] if path.startswith("/api/") else body["error"]["message"]
        assert resp.status == 502 and message == "backend 'up' returned 0 embeddings for 1 input", body


@pytest.mark.parametrize("kind", ["openai", "ollama"])
async def test_a_vector_count_of_one_says_so_in_the_singular(kind: str) -> None:
    """The 502 counts as a person writes ("1 input", where it said "1 inputs"), for a batch too."""
    async with upstream(kind) as up, velo(kind, up.url) as c:
        vectors = [[0.6, 0.8]] * 2
        up.script.answer = {"object": "list", "data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]} \
            if kind == "openai" else {"model": "m", "embeddings": vectors}
        resp = await c.post("/api/embed", json={"model": "m", "input": "one"})
        assert resp.status == 502 and (await resp.json())["error"].endswith("returned 2 embeddings for 1 input")
        up.script.answer = {"object": "list", "data": [{"index": 0, "embedding": [0.6, 0.8]}]} \
            if kind == "openai" else {"model": "m", "embeddings": [[0.6, 0.8]]}
        resp = await c.post("/api/embed", json={"model": "m", "input": ["one", "two"]})
        assert resp.status == 502 and "returned 1 embedding for 2 inputs" in (await resp.json())["error"]


@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed"])
async def test_ollamas_own_refusal_of_a_nan_vector_is_the_backends_502(path: str) -> None:
    """Ollama answers such a vector with a 400 (server/routes.go, normalize), which Velo passed on as the client's
    mistake; it is the model's, as from every other backend."""
    async with upstream("ollama") as up, velo("ollama", up.url) as c:
        up.script.fail_status, up.script.fail_message = 400, "embedding contains NaN or Inf values"
        resp = await c.post(path, json={"model": "m", "input": "hello"})
        body = await resp.json()
        message = body["error"] if path.startswith("/api/") else body["error"]["message"]
        assert resp.status == 502 and "backend 'up'" in message and "NaN" in message, body
        assert resp.headers["x-should-retry"] == "false"

