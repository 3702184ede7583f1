"""A stream the backend is still working on stays alive: a tool call held back while the model writes it sends the
headers and each dialect's empty event, the official clients read through them, the cache keeps none, time to first
token ignores them, and a call that then fails ends the stream with the dialect's error event."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import anthropic
import ollama
import openai
import orjson
import pytest
from aiohttp.test_utils import TestClient

from adapters.protocol import Chunk
from proxy.config import Config, ServerConfig
from proxy.stages.heartbeat import _beating
from tests.proxy.test_metrics import scrape, value
from tests.proxy.tools.test_http import BAD, CALL, MESSAGES, WEATHER, _cut
from tests.scripted import Script, ScriptedBackend

SLOW_CALL = Script(pieces=_cut(CALL), delay=0.02)  # 18 pieces over ~0.4 s
PARIS = {"city": "Paris", "days": 2}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Current weather",
                  "input_schema": WEATHER["function"]["parameters"]}


@pytest.fixture
def config() -> Config:
    return Config(server=ServerConfig(max_body_bytes=64 * 1024, heartbeat_s=0.05))


async def _timed(*items: tuple[float, Chunk]) -> AsyncIterator[Chunk]:
    for pause, chunk in items:
        await asyncio.sleep(pause)
        yield chunk


async def test_signs_of_life_become_a_heartbeat_only_after_the_silence() -> None:
    """Empty chunks are dropped; one that comes `every` seconds after the last chunk sent is a heartbeat."""
    life = Chunk()
    out = [c async for c in _beating(_timed((0.0, life), (0.06, life), (0.01, life), (0.0, Chunk(text="a")),
                                            (0.03, life), (0.06, life), (0.0, Chunk(finish_reason="stop"))), 0.05)]
    assert [("beat" if c.heartbeat else c.text or c.finish_reason) for c in out] == ["beat", "a", "beat", "stop"]


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
async def test_anthropic_sends_empty_text_deltas_while_the_call_is_written(client: TestClient, base_url: str) -> None:
    """Claude Code's idle watchdog skips `ping`: it abandoned a turn after 300 s of them. Heartbeats are empty
    deltas of a text block opened for them, which the call then follows as the next block."""
    body = {"model": "tiny", "max_tokens": 100, "messages": MESSAGES, "tools": [ANTHROPIC_TOOL], "stream": True}
    resp = await client.post("/v1/messages", json=body)
    events = [orjson.loads(b.split(b"data: ", 1)[1]) for b in (await resp.read()).split(b"\n\n") if b]
    kinds = [e["type"] for e in events]
    call = next(i for i, e in enumerate(events) if e.get("content_block", {}).get("type") == "tool_use")
    assert kinds[:3] == ["message_start", "ping", "content_block_start"] and events[2]["content_block"]["type"] == "text"
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
