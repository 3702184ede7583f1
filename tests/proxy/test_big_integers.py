"""Integers past 64 bits through Velo. orjson reads one as a float and writes none: a tool call's
`{"id": 12345678901234567890123}` reached the client as `{"id":1.2345678901234568e22}`, where OpenAI's wire carries
arguments as text and Python's json (vLLM's, the SDKs') keeps them whole. Each is read and written whole."""
from __future__ import annotations

import json

import anthropic
import ollama
import openai
import pytest
from aiohttp.test_utils import TestClient

from tests.fakes import FakeOpenAI

BIG = 12345678901234567890123
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"id": {"type": "integer", "maximum": BIG}}}}}
RESPONSES_TOOL = {"type": "function", **TOOL["function"]}
ASK = [{"role": "user", "content": "look it up"}]


def _sent_arguments(up: FakeOpenAI) -> dict:
    """The arguments of the history's call, as the backend read them (the fake reads with Python's json)."""
    body = up.last("/v1/chat/completions")
    assert body["tools"][0]["function"]["parameters"]["properties"]["id"]["maximum"] == BIG
    return json.loads(body["messages"][1]["tool_calls"][0]["function"]["arguments"])


async def test_a_clients_history_and_schema_keep_integers_past_64_bits(served: tuple[TestClient, FakeOpenAI]) -> None:
    client, up = served
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"id": %d}' % BIG}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "found"}]
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "tools": [TOOL]})
    assert resp.status == 200, await resp.text()
    assert _sent_arguments(up) == {"id": BIG}

    messages = [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "lookup",
                                                          "input": {"id": BIG}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "found"}]}]
    anthropic_tool = {"name": "lookup", "input_schema": TOOL["function"]["parameters"]}
    resp = await client.post("/v1/messages", json={"model": "m", "max_tokens": 9, "messages": messages,
                                                   "tools": [anthropic_tool]})
    assert resp.status == 200, await resp.text()
    assert _sent_arguments(up) == {"id": BIG}

    items = [{"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"id": %d}' % BIG},
             {"type": "function_call_output", "call_id": "c1", "output": "found"}]
    resp = await client.post("/v1/responses", json={"model": "m", "input": [*ASK, *items], "tools": [RESPONSES_TOOL]})
    assert resp.status == 200, await resp.text()
    assert _sent_arguments(up) == {"id": BIG}


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", {"seed": 2**70}),
                                       ("/api/chat", {"options": {"seed": 2**70}, "stream": False})])
async def test_an_integer_setting_past_64_bits_is_a_400_naming_it(served: tuple[TestClient, FakeOpenAI], path: str,
                                                                   body: dict) -> None:
    """Read as a float, OpenAI's was refused as "not an integer"; read whole, it must not reach a backend."""
    resp = await served[0].post(path, json={"model": "m", "messages": ASK, **body})
    answer = await resp.json()
    assert resp.status == 400, answer
    assert "seed" in json.dumps(answer) and "out of range" in json.dumps(answer)


def _streamed_arguments(text: str) -> str:
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    return "".join(c["function"].get("arguments", "") for e in events for ch in e["choices"]
                   for c in ch["delta"].get("tool_calls") or [])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_models_tool_call_keeps_integers_past_64_bits(served: tuple[TestClient, FakeOpenAI],
                                                               stream: bool) -> None:
    """In each dialect, streamed or not; the schema's own bound, read whole too, lets it through."""
    client, up = served
    up.script.tool_calls = [{"name": "lookup", "arguments": '{"id": %d}' % BIG}]
    body = {"model": "m", "messages": ASK, "tools": [TOOL], "stream": stream}
    resp = await client.post("/v1/chat/completions", json=body)
    if stream:
        arguments = _streamed_arguments(await resp.text())
    else:
        arguments = (await resp.json())["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"id": BIG}, arguments
    if stream:
        return
    resp = await client.post("/api/chat", json=body)
    assert (await resp.json())["message"]["tool_calls"][0]["function"]["arguments"] == {"id": BIG}
    anthropic_tool = {"name": "lookup", "input_schema": TOOL["function"]["parameters"]}
    resp = await client.post("/v1/messages", json={**body, "max_tokens": 9, "tools": [anthropic_tool]})
    assert [b["input"] for b in (await resp.json())["content"] if b["type"] == "tool_use"] == [{"id": BIG}]
    resp = await client.post("/v1/responses", json={"model": "m", "input": ASK, "tools": [RESPONSES_TOOL]})
    calls = [i["arguments"] for i in (await resp.json())["output"] if i["type"] == "function_call"]
    assert [json.loads(a) for a in calls] == [{"id": BIG}]


async def test_a_repaired_structured_answer_keeps_integers_past_64_bits(served: tuple[TestClient, FakeOpenAI]) -> None:
    """A JSON answer Velo repairs (here a trailing comma) is written again: as the model wrote it, not as a float."""
    client, up = served
    up.script.reply = '{"id": %d,}' % BIG
    resp = await client.post("/api/chat", json={"model": "m", "messages": ASK, "stream": False, "format": "json"})
    assert json.loads((await resp.json())["message"]["content"]) == {"id": BIG}


async def test_the_official_clients_read_a_tool_call_past_64_bits_whole(served: tuple[TestClient, FakeOpenAI]) -> None:
    """The answers above as openai, anthropic and ollama read them (Python's json underneath each): the integer
    whole, streamed or not."""
    client, up = served
    up.script.tool_calls = [{"name": "lookup", "arguments": '{"id": %d}' % BIG}]
    base = str(client.make_url("")).rstrip("/")
    oai = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    answer = await oai.chat.completions.create(model="m", messages=ASK, tools=[TOOL])
    assert json.loads(answer.choices[0].message.tool_calls[0].function.arguments) == {"id": BIG}
    async with oai.chat.completions.stream(model="m", messages=ASK, tools=[TOOL]) as stream:
        final = await stream.get_final_completion()
    assert json.loads(final.choices[0].message.tool_calls[0].function.arguments) == {"id": BIG}
    claude = anthropic.AsyncAnthropic(base_url=base, api_key="sk-test", max_retries=0)
    tool = {"name": "lookup", "input_schema": TOOL["function"]["parameters"]}
    message = await claude.messages.create(model="m", max_tokens=9, messages=ASK, tools=[tool])
    assert [b.input for b in message.content if b.type == "tool_use"] == [{"id": BIG}]
    async with claude.messages.stream(model="m", max_tokens=9, messages=ASK, tools=[tool]) as stream:
        message = await stream.get_final_message()
    assert [b.input for b in message.content if b.type == "tool_use"] == [{"id": BIG}]
    reply = await ollama.AsyncClient(host=base).chat(model="m", messages=ASK, tools=[TOOL])
    assert reply.message.tool_calls[0].function.arguments == {"id": BIG}
