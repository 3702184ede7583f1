"""A quiet stream stays alive: after `server.heartbeat_s` with nothing to send (a backend silent while it reads the
prompt, a queue for the backend's slot, a tool call held back while the model writes it) the client gets the headers
and each dialect's empty event, the official clients read through them, the cache keeps none, time to first token
ignores them, a call that then fails ends the stream with the dialect's error event, and the heartbeats' timer
changes nothing of who may cancel the stream (a newer autocomplete, the client leaving)."""
from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import ollama
import openai
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.protocol import Chunk, ToolCall
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config, ServerConfig
from proxy.dialects import anthropic as anthropic_dialect
from proxy.http_io import _Out
from tests.loop_watch import loop_gaps
from tests.proxy.test_metrics import scrape, value
from tests.proxy.test_stream_faults import stream_error
from tests.proxy.tools.test_http import BAD, CALL, MESSAGES, WEATHER, _cut
from tests.scripted import Script, ScriptedBackend

SLOW_CALL = Script(pieces=_cut(CALL), delay=0.02)  # 18 pieces over ~0.4 s
PARIS = {"city": "Paris", "days": 2}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Current weather",
                  "input_schema": WEATHER["function"]["parameters"]}
QUIET = Config(server=ServerConfig(heartbeat_s=0.05), cache=CacheConfig(enabled=False))


@pytest.fixture
def config() -> Config:
    return Config(server=ServerConfig(max_body_bytes=64 * 1024, heartbeat_s=0.05))


async def _until(condition, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


# Each dialect's stream, and the bytes of its heartbeat
DIALECTS = [("/api/chat", {"model": "tiny", "messages": MESSAGES}, b'"content":""'),
            ("/v1/chat/completions", {"model": "tiny", "messages": MESSAGES, "stream": True}, b": keepalive"),
            ("/v1/messages", {"model": "tiny", "max_tokens": 100, "messages": MESSAGES, "stream": True},
             b"event: ping"),  # one follows message_start, heartbeat or not
            ("/v1/responses", {"model": "tiny", "input": "hi", "stream": True}, b"event: response.in_progress")]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(silence=0.4))])
@pytest.mark.parametrize("path,body,beat", DIALECTS)
async def test_a_backend_silent_before_its_first_token_gets_heartbeats_in_every_dialect(
        client: TestClient, path: str, body: dict, beat: bytes) -> None:
    """Ollama sends nothing while it reads a prompt (nor does a vLLM while it prefills), so the stream has nothing
    to pass on: the timer alone keeps the client, then the answer follows whole."""
    resp = await client.post(path, json=body)
    raw = await resp.read()
    before, _, after = raw.partition(b"Hel")
    beats = before.count(beat) - (path == "/v1/messages")
    assert resp.status == 200 and beats >= 2 and b"lo" in after and b" world" in after


# Each dialect's last event of an answer
ENDS = {"/api/chat": b'"done":true', "/v1/chat/completions": b'"finish_reason":"stop"',
        "/v1/messages": b"event: message_stop", "/v1/responses": b"event: response.completed"}


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(after_finish=0.3, fail_after_finish=True))])
@pytest.mark.parametrize("path,body,beat", DIALECTS)
async def test_nothing_but_the_dialects_end_follows_an_answers_last_event(client: TestClient, path: str, body: dict,
                                                                          beat: bytes) -> None:
    """What the pipeline does after the answer (the cache's store; here the backend's stream, open past its finishing
    chunk, then failing) wrote heartbeats after `message_stop` or `response.completed`, and an error event, which
    the SDKs raise, on an answer that had ended."""
    resp = await client.post(path, json=body)
    raw = await resp.read()
    tail = raw.partition(ENDS[path])[2]
    assert resp.status == 200 and beat not in tail and b'"error":{' not in tail and b'"error":"' not in tail
    assert stream_error(path, raw) is None
    assert tail.count(b"\n\n" if path.startswith("/v1/") else b"\n") == (2 if path == "/v1/chat/completions" else 1)


@pytest.mark.parametrize("path,body,beat", DIALECTS)
async def test_a_heartbeat_while_the_answers_end_is_written_follows_it_in_no_dialect(
        client: TestClient, path: str, body: dict, beat: bytes, monkeypatch) -> None:
    """The timer stopped once the write of the answer's end returned; a client reading slowly holds that write
    (its socket full), and a heartbeat the timer wrote meanwhile followed the end: an Ollama line `done: false` after
    `done: true`, a text block after `message_stop`."""
    write = _Out.write

    async def held(out: _Out, data: bytes) -> None:
        await write(out, data)
        if ENDS[path] in data:
            await asyncio.sleep(0.3)  # six heartbeat periods with the end's bytes out, its write not returned
    monkeypatch.setattr(_Out, "write", held)
    raw = await (await client.post(path, json=body)).read()
    assert beat not in raw.partition(ENDS[path])[2]


def test_a_heartbeat_while_an_anthropic_answers_last_events_are_written_adds_nothing_after_message_stop() -> None:
    """The timer stops once the write of the answer's end returns; a client reading slowly holds that write (a 4 MiB
    tool call unread for a second did), and the timer's heartbeat opened a text block after `message_stop`, which the
    SDK added to the finished message. The Responses API's writer already wrote nothing once its response ended."""
    writer = anthropic_dialect.MessageStream("msg_1", "tiny")
    end = writer.encode(Chunk(tool_calls=[ToolCall("get_weather", PARIS, "toolu_1")], finish_reason="tool_calls"))
    assert end.endswith(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    assert writer.encode(Chunk(heartbeat=True)) == b""


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(silence=0.3))])
async def test_the_sdks_read_an_answer_whose_heartbeats_came_first(base_url: str) -> None:
    """Anthropic's heartbeat opens the text block the answer then fills; the Responses API's are
    `response.in_progress` events before any item: each SDK's final object holds the answer alone."""
    claude = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-test", max_retries=0)
    async with claude.messages.stream(model="tiny", max_tokens=100, messages=MESSAGES) as s:
        message = await s.get_final_message()
    assert [(b.type, b.text) for b in message.content] == [("text", "Hello world")]
    sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    async with sdk.responses.stream(model="tiny", input="hi") as stream:
        response = await stream.get_final_response()
    assert response.output_text == "Hello world" and len(response.output) == 1
    parts = [p async for p in await ollama.AsyncClient(host=base_url).chat(model="tiny", messages=MESSAGES,
                                                                            stream=True)]
    assert "".join(p.message.content for p in parts) == "Hello world" and parts[-1].done


async def test_a_stream_waiting_for_its_backends_slot_gets_its_headers_and_heartbeats() -> None:
    backend = ScriptedBackend("s", script=Script(pieces=["x"] * 50, delay=0.02))  # a second of work
    backend.config.max_concurrency = 1
    async with TestClient(TestServer(make_app(QUIET, {"s": backend}), handler_cancellation=True)) as c:
        busy = asyncio.create_task(c.post("/api/chat", json={"model": "tiny", "messages": MESSAGES,
                                                             "stream": False}))
        await _until(lambda: len(backend.requests) == 1)
        queued = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True})
        assert queued.status == 200 and len(backend.requests) == 1  # its headers came while it waited
        raw = await queued.read()
        assert raw.partition(b'"content":"x"')[0].count(b": keepalive") >= 2 and raw.count(b'"content":"x"') == 50
        assert (await busy).status == 200


async def test_a_newer_autocomplete_replaces_an_older_one_kept_alive_by_heartbeats() -> None:
    """The pipeline stays in the handler's task, whose cancelling is how a newer autocomplete at the same place
    stops an older one: its stream, already open, ends with the error line."""
    backend = ScriptedBackend("s", script=Script(silence=1.0))

    async def fim(prompt: str):
        return await c.post("/api/generate", json={"model": "tiny", "prompt": prompt, "suffix": ")\n"})
    async with TestClient(TestServer(make_app(QUIET, {"s": backend}), handler_cancellation=True)) as c:
        older = await fim("def a(")
        assert orjson.loads(await older.content.readline())["response"] == ""  # a heartbeat
        newer = await fim("def ab(")
        lines = [orjson.loads(line) for line in (await older.read()).splitlines()]
        assert "replaced" in lines[-1]["error"] and orjson.loads((await newer.read()).splitlines()[-1])["done"]
    assert backend.cancelled == 1 and backend.completed == 1


async def test_a_client_leaving_a_stream_kept_alive_by_heartbeats_cancels_the_backends_work() -> None:
    backend = ScriptedBackend("s", script=Script(silence=5.0))
    async with TestClient(TestServer(make_app(QUIET, {"s": backend}), handler_cancellation=True)) as c:
        resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True})
        assert b"assistant" in await resp.content.readany()  # the role delta: the first heartbeat
        resp.close()
        await _until(lambda: backend.cancelled == 1)
    assert backend.completed == 0


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=SLOW_CALL)])
async def test_openai_chat_opens_with_the_role_then_sends_comments_until_the_call(client: TestClient,
                                                                                    base_url: str) -> None:
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True,
                                                           "tools": [WEATHER]})
    blocks = (await resp.read()).split(b"\n\n")
    assert orjson.loads(blocks[0][6:])["choices"][0]["delta"]["role"] == "assistant"
    call_at = next(i for i, b in enumerate(blocks) if b"tool_calls" in b)
    assert blocks[1:call_at] and set(blocks[1:call_at]) == {b": keepalive"}
    sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    async with sdk.beta.chat.completions.stream(model="tiny", messages=MESSAGES, tools=[WEATHER]) as stream:
        final = await stream.get_final_completion()
    assert orjson.loads(final.choices[0].message.tool_calls[0].function.arguments) == PARIS


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=SLOW_CALL)])
async def test_anthropic_pings_before_a_call_that_comes_within_a_minute(client: TestClient, base_url: str) -> None:
    """A call held back a short while leaves the message as Anthropic's would be: pings before it, no empty text
    block opened for heartbeats (the SDK kept one in the message, before the tool_use)."""
    body = {"model": "tiny", "max_tokens": 100, "messages": MESSAGES, "tools": [ANTHROPIC_TOOL], "stream": True}
    resp = await client.post("/v1/messages", json=body)
    events = [orjson.loads(b.split(b"data: ", 1)[1]) for b in (await resp.read()).split(b"\n\n") if b]
    call = next(i for i, e in enumerate(events) if e.get("content_block", {}).get("type") == "tool_use")
    assert events[0]["type"] == "message_start" and call > 4
    assert {e["type"] for e in events[1:call]} == {"ping"}
    sdk = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-test", max_retries=0)
    async with sdk.messages.stream(model="tiny", max_tokens=100, messages=MESSAGES, tools=[ANTHROPIC_TOOL]) as s:
        final = await s.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [("tool_use", PARIS)]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=SLOW_CALL)])
async def test_anthropic_sends_empty_text_deltas_while_the_call_is_written(client: TestClient, base_url: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Claude Code's idle watchdog skips `ping`: it abandoned a turn after 300 s of them. Past the first minute,
    heartbeats are empty deltas of a text block opened for them, which the call then follows as the next block."""
    monkeypatch.setattr(anthropic_dialect, "CONTENT_HEARTBEATS_AFTER_S", 0.0)
    body = {"model": "tiny", "max_tokens": 100, "messages": MESSAGES, "tools": [ANTHROPIC_TOOL], "stream": True}
    resp = await client.post("/v1/messages", json=body)
    events = [orjson.loads(b.split(b"data: ", 1)[1]) for b in (await resp.read()).split(b"\n\n") if b]
    kinds = [e["type"] for e in events]
    call = next(i for i, e in enumerate(events) if e.get("content_block", {}).get("type") == "tool_use")
    assert kinds[:3] == ["message_start", "ping", "content_block_start"] \
        and events[2]["content_block"]["type"] == "text"
    beats = [e for e in events[3:call - 1] if e["type"] == "content_block_delta"]
    assert len(beats) >= 3 and all(e["delta"] == {"type": "text_delta", "text": ""} for e in beats)
    sdk = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-test", max_retries=0)
    async with sdk.messages.stream(model="tiny", max_tokens=100, messages=MESSAGES, tools=[ANTHROPIC_TOOL]) as s:
        final = await s.get_final_message()
    assert [(b.type, getattr(b, "input", b"")) for b in final.content if b.type != "text" or b.text] == [
        ("tool_use", PARIS)]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=SLOW_CALL)])
async def test_responses_created_then_in_progress_events_until_the_call(client: TestClient, base_url: str) -> None:
    """Codex's idle timer counts events, not SSE comments: with comments it dropped a stream whose prompt a CPU read
    for minutes, and sent it again. Each heartbeat is `response.in_progress` again, numbered as every event."""
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": "weather in Paris?", "stream": True,
                                                    "tools": [{"type": "function", **WEATHER["function"]}]})
    blocks = [b for b in (await resp.read()).split(b"\n\n") if b]
    assert [b.split(b"\n")[0] for b in blocks[:2]] == [b"event: response.created", b"event: response.in_progress"]
    call_at = next(i for i, b in enumerate(blocks) if b"function_call" in b)
    assert call_at > 2 and {b.split(b"\n")[0] for b in blocks[2:call_at]} == {b"event: response.in_progress"}
    numbers = [orjson.loads(b.split(b"data: ", 1)[1])["sequence_number"] for b in blocks]
    assert numbers == list(range(len(blocks)))
    sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    async with sdk.responses.stream(model="tiny", input="weather in Paris?",
                                    tools=[{"type": "function", **WEATHER["function"]}]) as stream:
        final = await stream.get_final_response()
    assert [orjson.loads(i.arguments) for i in final.output if i.type == "function_call"] == [PARIS]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=SLOW_CALL)])
async def test_ollama_sends_empty_lines_until_the_call(base_url: str) -> None:
    parts = [p async for p in await ollama.AsyncClient(host=base_url).chat(
        model="tiny", messages=MESSAGES, tools=[WEATHER], stream=True)]
    calls = [i for i, p in enumerate(parts) if p.message.tool_calls]
    assert calls and calls[0] >= 3 and all(p.message.content == "" and not p.done for p in parts[:calls[0]])
    assert dict(parts[calls[0]].message.tool_calls[0].function.arguments) == PARIS and parts[-1].done


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=SLOW_CALL)])
async def test_a_cached_answer_replays_without_keepalives(client: TestClient) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "stream": True, "tools": [WEATHER], "temperature": 0}
    first = await (await client.post("/v1/chat/completions", json=body)).read()
    again = await client.post("/v1/chat/completions", json=body)
    assert b": keepalive" in first and again.headers["X-Velo-Cache"] == "exact"
    replay = await again.read()
    assert b": keepalive" not in replay and b"Paris" in replay


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=_cut(BAD), delay=0.02))])
async def test_a_call_that_fails_after_a_keepalive_ends_the_stream_with_the_error_event(client: TestClient) -> None:
    """The status went out with the first keepalive: the failure is the stream's error event (a short call still
    gets the 502 status: tests/proxy/tools/test_http.py)."""
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True,
                                                           "tools": [WEATHER]})
    raw = await resp.read()
    error = orjson.loads(raw.split(b"\n\n")[-2][6:])  # the stream's last event
    assert resp.status == 200 and b": keepalive" in raw
    assert error["error"]["type"] == "tool_call_invalid" and "city" in error["error"]["message"]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=SLOW_CALL)])
async def test_time_to_first_token_is_the_calls_not_the_first_keepalives(client: TestClient) -> None:
    await (await client.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "tools": [WEATHER]})).read()
    found = await scrape(client)
    labels = {"endpoint": "/api/chat", "model": "tiny", "backend": "scripted"}
    assert value(found, "velo_time_to_first_token_seconds_count", **labels) == 1
    assert value(found, "velo_time_to_first_token_seconds_sum", **labels) > 0.3  # 18 pieces 0.02 s apart


async def test_each_key_reaches_the_backend_as_its_own_prefix_scope() -> None:
    """In every dialect; a request without a key has none (one user's tools share a backend's prefix cache)."""
    from proxy.auth import tenant_of
    scripted = ScriptedBackend()
    async with TestClient(TestServer(make_app(Config(cache=CacheConfig(enabled=False)), {"s": scripted}))) as c:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": False}
        a = {"Authorization": "Bearer sk-a"}
        for path, auth in (("/api/chat", a), ("/v1/chat/completions", {}), ("/v1/messages", {"x-api-key": "sk-b"}),
                           ("/api/generate", a)):
            body = {"model": "tiny", "prompt": "hi", "stream": False} if path == "/api/generate" else chat
            assert (await c.post(path, json=body, headers=auth)).status == 200
    assert [r.prefix_scope for r in scripted.requests] == [tenant_of("sk-a"), "", tenant_of("sk-b"), tenant_of("sk-a")]


async def test_a_long_cached_answer_lets_other_requests_run_while_it_is_written() -> None:
    """A write waits for nothing while the socket takes it, and a cache hit's pieces wait for nothing either: a
    60,000-piece replay held the event loop from its first byte to its last."""
    backend = ScriptedBackend(script=Script(pieces=["w "] * 60_000))
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as client:
        body = {"model": "tiny", "messages": MESSAGES, "stream": True, "temperature": 0}
        await (await client.post("/v1/chat/completions", json=body)).read()

        async def replayed() -> tuple[Any, bytes, float]:
            started = asyncio.get_running_loop().time()
            resp = await client.post("/v1/chat/completions", json=body)
            return resp, await resp.read(), asyncio.get_running_loop().time() - started
        (again, replay, took), gaps = await loop_gaps(replayed(), every=0)
    assert again.headers["X-Velo-Cache"] == "exact" and replay.count(b"w ") == 60_000
    assert max(gaps) < took / 3, (max(gaps), took)
