"""Client input that used to give 500s, and what a client is told about the rules of the road: nesting extremes,
odd field types, a seed at the top of the 64-bit range, a wrong method, a huge declared body."""
from __future__ import annotations

import asyncio
import gzip
import json
import threading
from types import ModuleType

import pytest
from aiohttp.test_utils import TestClient

from adapters.fields import nests_deeper
from adapters.protocol import ChatRequest
from proxy import http_io
from proxy.cache import keys
from proxy.cache.config import CacheConfig
from proxy.config import Config, ServerConfig
from proxy.dialects import anthropic, ollama, openai, responses
from tests.fakes import FakeOpenAI

MESSAGES = [{"role": "user", "content": "hi"}]


def nested(depth: int, leaf: object = 1) -> object:
    value = leaf
    for n in range(depth):
        value = {"a": value} if n % 2 else [value]
    return value


class Raw:
    """JSON text written by hand: every encoder refuses to write 1,000 levels, and the point is to send them."""

    def __init__(self, depth: int):
        self.text = "".join('{"a": ' if n % 2 else "[" for n in reversed(range(depth))) + "1" + "".join(
            "}" if n % 2 else "]" for n in range(depth))


async def post_raw(client: TestClient, path: str, body: dict) -> tuple[int, dict]:
    text = json.dumps({k: v for k, v in body.items() if not isinstance(v, Raw)})
    for key, value in body.items():
        if isinstance(value, Raw):
            text = text[:-1] + f', "{key}": {value.text}}}'
    resp = await client.post(path, data=text, headers={"Content-Type": "application/json"})
    return resp.status, await resp.json()


@pytest.mark.parametrize("depth", [65, 256, 1000])
@pytest.mark.parametrize("path,field", [
    ("/v1/chat/completions", "tools"), ("/v1/chat/completions", "tool_choice"), ("/api/chat", "format"),
    ("/api/chat", "options"), ("/v1/chat/completions", "response_format"), ("/v1/messages", "metadata"),
    ("/v1/responses", "input")])
async def test_deep_nesting_anywhere_is_a_400(client: TestClient, path: str, field: str, depth: int) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 5, field: Raw(depth)}
    status, answer = await post_raw(client, path, body)
    assert status == 400 and "deeper than 64 levels" in json.dumps(answer), answer


async def test_ordinary_nesting_still_passes(client: TestClient) -> None:
    schema = {"type": "object", "properties": {"a": nested(20, {"type": "string"})}}
    status, _ = await post_raw(client, "/api/chat", {"model": "tiny", "messages": MESSAGES, "stream": False,
                                                      "format": {"type": "object", "properties": {"x": schema}}})
    assert status in (200, 502)  # the scripted answer is not JSON; what matters is that it was taken


@pytest.mark.parametrize("body,where", [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "http://x/cat.png"}]}]},
     "image_url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}]}, "image_url"),
    ({"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": "a schema"}},
     "json_schema"),
])
async def test_odd_field_types_are_a_400_naming_the_field(client: TestClient, body: dict, where: str) -> None:
    status, answer = await post_raw(client, "/v1/chat/completions", {"model": "tiny", **body})
    assert status == 400 and where in answer["error"]["message"], answer


async def test_a_seed_at_the_top_of_64_bits_with_several_choices_wraps(served: tuple[TestClient, FakeOpenAI]) -> None:
    c, up = served
    resp = await c.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "n": 3, "seed": 2**64 - 1})
    assert resp.status == 200 and len((await resp.json())["choices"]) == 3
    assert sorted(r.body["seed"] for r in up.requests if r.method == "POST") == [0, 1, 2**64 - 1]


async def test_a_wrong_method_says_which_are_allowed(client: TestClient) -> None:
    resp = await client.get("/api/chat")
    assert resp.status == 405 and resp.headers["Allow"] == "POST"
    resp = await client.put("/v1/responses/resp_1")
    assert resp.status == 405 and set(resp.headers["Allow"].split(", ")) == {"DELETE", "GET", "HEAD"}


async def test_a_body_its_content_encoding_does_not_decode_is_a_400(client: TestClient) -> None:
    """A gzip body is read as sent (aiohttp decodes it); one that is not gzip was a 500, which SDKs retry."""
    body = {"model": "tiny", "messages": MESSAGES, "stream": False}
    resp = await client.post("/api/chat", data=gzip.compress(json.dumps(body).encode()),
                             headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert resp.status == 200 and (await resp.json())["done"] is True
    for path in ("/api/chat", "/v1/chat/completions"):
        resp = await client.post(path, data=json.dumps(body), headers={"Content-Encoding": "gzip"})
        answer = await resp.json()
        assert resp.status == 400, answer
        assert "could not be read" in (answer["error"] if path == "/api/chat" else answer["error"]["message"])


async def test_a_trailing_slash_is_sent_where_ollama_sends_it(client: TestClient) -> None:
    """Ollama's router answers `/api/chat/` with a 307 to `/api/chat` (method and body kept) and a GET with a 301; a
    path without a route stays a 404 in the dialect."""
    resp = await client.post("/api/chat/", json={"model": "tiny", "messages": MESSAGES, "stream": False})
    assert resp.status == 200 and resp.url.path == "/api/chat" and (await resp.json())["done"] is True
    resp = await client.get("/v1/models/?limit=5", allow_redirects=False)
    assert resp.status == 301 and resp.headers["Location"] == "/v1/models?limit=5"
    resp = await client.post("/v1/nothing/", json={})
    assert resp.status == 404 and "no route" in (await resp.json())["error"]["message"]


@pytest.mark.parametrize("config", [Config()])
async def test_a_chat_with_photos_fits_under_the_default_limit(client: TestClient, scripted) -> None:
    """Open WebUI sends every image of a chat again, as base64, with each turn: two phone photos passed 8 MiB."""
    photo = "A" * (5 * 1024 * 1024)
    body = {"model": "tiny", "stream": False, "messages": [{"role": "user", "content": "a", "images": [photo]},
                                                           {"role": "assistant", "content": "b"},
                                                           {"role": "user", "content": "c", "images": [photo]}]}
    resp = await client.post("/api/chat", json=body)
    assert resp.status == 200 and [len(m.images) for m in scripted.requests[0].messages] == [1, 0, 1]


@pytest.mark.parametrize("config", [Config()])
async def test_another_clients_request_is_served_while_a_large_body_is_parsed(client: TestClient, scripted,
                                                                             monkeypatch) -> None:
    """A 20+ MB body took the event loop, every client's, for its whole parse (348 ms for a 28 MB history): the
    parse of a large body stands here in the depth check, which waits for another client's answer, up to 2 s."""
    parsing, answered, served_meanwhile = threading.Event(), threading.Event(), []

    def waits_for_another_client(value: object) -> bool:
        parsing.set()
        served_meanwhile.append(answered.wait(2))
        return nests_deeper(value)
    monkeypatch.setattr(http_io, "nests_deeper", waits_for_another_client)
    big = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
    large = asyncio.create_task(client.post("/v1/messages", json=big))
    await asyncio.to_thread(parsing.wait, 5)
    monkeypatch.setattr(http_io, "nests_deeper", nests_deeper)  # the other client's own body is small
    other = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 5, "messages": MESSAGES})
    answered.set()
    assert other.status == 200 and (await large).status == 200
    assert served_meanwhile == [True]


LARGE = "x" * (2 * 1024 * 1024)


@pytest.mark.parametrize("config", [Config()])
@pytest.mark.parametrize("path,dialect,parse,body", [
    ("/v1/messages", anthropic, "parse_messages", {"model": "tiny", "max_tokens": 5, "messages": MESSAGES}),
    ("/v1/chat/completions", openai, "parse_chat", {"model": "tiny", "messages": MESSAGES}),
    ("/v1/completions", openai, "parse_completions", {"model": "tiny", "prompt": "hi"}),
    ("/v1/responses", responses, "parse_request", {"model": "tiny", "input": "hi"}),
    ("/api/chat", ollama, "parse_chat", {"model": "tiny", "stream": False, "messages": MESSAGES}),
    ("/api/generate", ollama, "parse_generate", {"model": "tiny", "stream": False, "prompt": "hi"})])
async def test_another_clients_request_is_served_while_a_large_body_is_parsed_in_its_dialect(
        client: TestClient, scripted, monkeypatch, path: str, dialect: ModuleType, parse: str, body: dict) -> None:
    """The dialect's parse of a 28 MB history (100,000 messages) held the event loop after the JSON parse had left
    it: 300 ms to 1 s that no other client was answered. The first parse, the large body's, stands here for it: it
    waits for another client's answer, up to 2 s."""
    parsing, answered, served_meanwhile, real = threading.Event(), threading.Event(), [], getattr(dialect, parse)

    def waits_for_another_client(*args: object, **kwargs: object) -> object:
        if not parsing.is_set():
            parsing.set()
            served_meanwhile.append(answered.wait(2))
        return real(*args, **kwargs)
    monkeypatch.setattr(dialect, parse, waits_for_another_client)
    field = next(k for k in ("messages", "prompt", "input") if k in body)
    big = {**body, field: [{"role": "user", "content": LARGE}] if field == "messages" else LARGE}
    large = asyncio.create_task(client.post(path, json=big))
    await asyncio.to_thread(parsing.wait, 5)
    other = await client.post(path, json=body)
    answered.set()
    assert other.status == 200 and (await large).status == 200
    assert served_meanwhile == [True]


@pytest.mark.parametrize("config", [Config(), Config(cache=CacheConfig(enabled=False))], ids=["cache", "coalescing"])
async def test_another_clients_request_is_served_while_a_large_requests_key_is_worked_out(client: TestClient,
                                                                                          monkeypatch) -> None:
    """The cache's key of a deterministic request, and coalescing's, each read the whole request on the event loop:
    0.5 s each for a 28 MB history. The first key of the large request, the cache's or (with the cache off)
    coalescing's, stands here for it: it waits for another client's answer, up to 2 s."""
    parsing, answered, served_meanwhile, real = threading.Event(), threading.Event(), [], keys.canonical

    def waits_for_another_client(req: ChatRequest) -> dict:
        if not parsing.is_set() and len(req.messages[0].content) == len(LARGE):
            parsing.set()
            served_meanwhile.append(answered.wait(2))
        return real(req)
    monkeypatch.setattr(keys, "canonical", waits_for_another_client)
    body = {"model": "tiny", "temperature": 0, "messages": MESSAGES}
    large = asyncio.create_task(client.post("/v1/chat/completions",
                                            json={**body, "messages": [{"role": "user", "content": LARGE}]}))
    await asyncio.to_thread(parsing.wait, 5)
    other = await client.post("/v1/chat/completions", json=body)
    answered.set()
    assert other.status == 200 and (await large).status == 200
    assert served_meanwhile == [True]


@pytest.mark.parametrize("config", [Config()])
@pytest.mark.parametrize("stream", [False, True])
async def test_another_clients_request_is_served_while_a_large_responses_input_is_made_ready_to_store(
        client: TestClient, monkeypatch, stream: bool) -> None:
    """A Responses request's input items were made into the items it stores on the event loop, once its answer was
    there: 0.3 s for 100,000 items. The first item made, the large request's, waits for another client's answer
    here, up to 2 s."""
    parsing, answered, served_meanwhile, real = threading.Event(), threading.Event(), [], responses.stored_item

    def waits_for_another_client(item: dict) -> dict:
        if not parsing.is_set():
            parsing.set()
            served_meanwhile.append(answered.wait(2))
        return real(item)
    monkeypatch.setattr(responses, "stored_item", waits_for_another_client)
    large = asyncio.create_task(client.post("/v1/responses", json={"model": "tiny", "input": LARGE, "stream": stream}))
    await asyncio.to_thread(parsing.wait, 5)
    other = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
    answered.set()
    assert other.status == 200 and (await large).status == 200
    assert served_meanwhile == [True]


@pytest.mark.parametrize("config", [Config(server=ServerConfig(max_body_bytes=64 * 1024))])
async def test_a_huge_declared_body_is_refused_before_it_is_sent(client: TestClient) -> None:
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 10000000000\r\n\r\n")  # 10 GB promised, nothing sent
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)  # before: waited for the body, forever
    writer.close()
    assert head.startswith(b"HTTP/1.1 413")


async def test_a_model_name_longer_than_any_server_gives_is_refused_before_it_is_kept(client, scripted):
    """Names are kept (model info, cache keys): a 100 KB one pinned 100 KB, each of 1,024 of them."""
    long_name = "m" * 20_000
    chat = await client.post("/v1/chat/completions", json={"model": long_name, "messages": [{"role": "user",
                                                                                             "content": "hi"}]})
    assert chat.status == 400 and "at most 1024 characters" in (await chat.json())["error"]["message"]
    shown = await client.post("/api/show", json={"model": long_name})  # past Ollama's 80 characters a part
    assert (shown.status, await shown.json()) == (400, {"error": "invalid model name"})
    assert scripted.requests == []
