"""Streams end as Ollama and OpenAI end them: the last token in its own line, a final line with no content, and no
empty lines in between, whatever chunking the backend used."""
from __future__ import annotations

import orjson
import pytest

from adapters.protocol import ToolCall
from tests.scripted import ScriptedBackend

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture(autouse=True)
def like_the_engine(scripted: ScriptedBackend) -> None:
    """The engine's chunking: the last token inside the finishing chunk, empty chunks while text is held back."""
    scripted.script.last_in_finish, scripted.script.empties = True, 2


def sse_events(raw: bytes) -> list[dict]:
    return [orjson.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]


async def test_ollama_chat_final_line_has_empty_content_and_the_metrics(client):
    lines = [orjson.loads(x) for x in (await (await client.post("/api/chat", json=CHAT)).read()).splitlines()]
    assert [x["message"]["content"] for x in lines] == ["Hel", "lo", " world", ""]
    assert [x["done"] for x in lines] == [False, False, False, True]
    assert lines[-1]["done_reason"] == "stop" and lines[-1]["eval_count"] == 3


async def test_ollama_generate_sends_no_empty_response_lines(client):
    resp = await client.post("/api/generate", json={"model": "tiny", "prompt": "hi", "raw": True})
    lines = [orjson.loads(x) for x in (await resp.read()).splitlines()]
    assert [x["response"] for x in lines] == ["Hel", "lo", " world", ""] and lines[-1]["done"]


async def test_ollama_tool_calls_come_before_the_done_line(client, scripted: ScriptedBackend):
    scripted.script.tool_calls = [ToolCall("get_weather", {"city": "Paris"})]
    lines = [orjson.loads(x) for x in (await (await client.post("/api/chat", json=CHAT)).read()).splitlines()]
    assert lines[-2]["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert not lines[-2]["done"] and "tool_calls" not in lines[-1]["message"] and lines[-1]["done"]


async def test_openai_finish_reason_comes_in_its_own_chunk(client):
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream_options": {"include_usage": True}})
    events = sse_events(await resp.read())
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert [c["delta"].get("content") for c in choices] == ["", "Hel", "lo", " world", None]
    assert [c["finish_reason"] for c in choices] == [None, None, None, None, "stop"]
    assert choices[-1]["delta"] == {} and events[-1]["usage"]["completion_tokens"] == 3


async def test_openai_tool_call_turn_finishes_with_tool_calls(client, scripted: ScriptedBackend):
    scripted.script.tool_calls = [ToolCall("get_weather", {"city": "Paris"})]
    events = sse_events(await (await client.post("/v1/chat/completions", json=CHAT)).read())
    last = events[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["delta"] == {}
    assert events[-2]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"


async def test_openai_completions_stream_ends_with_an_empty_finishing_chunk(client):
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "stream": True})
    choices = [e["choices"][0] for e in sse_events(await resp.read())]
    assert [c["text"] for c in choices] == ["Hel", "lo", " world", ""]
    assert [c["finish_reason"] for c in choices][-2:] == [None, "stop"]


async def test_anthropic_and_responses_streams_still_end_whole(client):
    resp = await client.post("/v1/messages", json={**CHAT, "max_tokens": 20})
    raw = (await resp.read()).decode()
    assert raw.rstrip().endswith('"type":"message_stop"}') and "Hel" in raw and " world" in raw
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "stream": True})
    raw = (await resp.read()).decode()
    assert "event: response.completed" in raw and '"text":"Hello world"' in raw


@pytest.mark.parametrize("constrains, lines", [(True, ['{"a"', ": 1}", ""]), (False, ['{"a": 1}', ""])])
async def test_format_streams_token_by_token_from_a_backend_that_enforces_it(client, scripted, constrains, lines):
    scripted.constrains_format = constrains  # engine, llama-server, Ollama: a grammar; others: repaired whole
    scripted.script.pieces = ['{"a"', ": 1}"]
    resp = await client.post("/api/chat", json={**CHAT, "format": "json"})
    assert [orjson.loads(x)["message"]["content"] for x in (await resp.read()).splitlines()] == lines
