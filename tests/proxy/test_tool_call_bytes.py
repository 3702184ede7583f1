"""A tool call's arguments that need no repair reach the client as the backend wrote them. OpenAI's wire carries them
as a string, which Velo parsed and wrote again: `{"path": "caf\\u00e9.txt",  "n": 1.0, "big": 1e5}` reached the
client as `{"path":"café.txt","n":1.0,"big":100000.0}`. Where a dialect carries them as an object there is no string
to keep, only values: 1.0 stays a float, an integer past 64 bits whole. Arguments Velo repaired are written anew."""
from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config
from tests.fakes import FakeOpenAI

# unsorted keys, two spaces, a unicode escape, number spellings orjson writes otherwise, an integer past 64 bits
RAW = '{"path": "caf\\u00e9.txt",  "n": 1.0, "big": 1e5, "id": 123456789012345678901234, "a": [1 ,2]}'
PARAMETERS = {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "number"},
                                               "big": {"type": "number"}, "id": {"type": "integer"}}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": PARAMETERS}}
ASK = [{"role": "user", "content": "go"}]


@pytest.fixture
def served(served: tuple[TestClient, FakeOpenAI]) -> tuple[TestClient, FakeOpenAI]:
    """conftest's Velo over a fake, whose model calls the tool with RAW's arguments."""
    served[1].script.tool_calls = [{"name": "f", "arguments": RAW}]
    return served


def _events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def _chat_arguments(client: TestClient, stream: bool, **extra: object) -> str:
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "tools": [TOOL],
                                                           "stream": stream, **extra})
    assert resp.status == 200, await resp.text()
    if not stream:
        return (await resp.json())["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    return "".join(c["function"].get("arguments", "") for e in _events(await resp.text()) for ch in e["choices"]
                   for c in ch["delta"].get("tool_calls") or [])


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat_sends_valid_arguments_byte_for_byte(served: tuple[TestClient, FakeOpenAI],
                                                               stream: bool) -> None:
    assert await _chat_arguments(served[0], stream) == RAW


async def test_legacy_function_call_and_unoffered_tools_keep_the_text(served: tuple[TestClient, FakeOpenAI]) -> None:
    client, _ = served
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": ASK,
                                                           "functions": [TOOL["function"]]})
    assert (await resp.json())["choices"][0]["message"]["function_call"]["arguments"] == RAW
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": ASK})
    assert (await resp.json())["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == RAW


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_sends_valid_arguments_byte_for_byte(served: tuple[TestClient, FakeOpenAI],
                                                             stream: bool) -> None:
    tool = {"type": "function", **TOOL["function"]}
    resp = await served[0].post("/v1/responses", json={"model": "m", "input": ASK, "tools": [tool], "stream": stream})
    assert resp.status == 200, await resp.text()
    if not stream:
        assert [i["arguments"] for i in (await resp.json())["output"] if i["type"] == "function_call"] == [RAW]
        return
    events = _events(await resp.text())
    assert "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta") == RAW
    assert [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"] == [RAW]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["arguments"] for i in done if i["type"] == "function_call"] == [RAW]


async def test_anthropic_streams_the_text_and_object_dialects_keep_the_values(
        served: tuple[TestClient, FakeOpenAI]) -> None:
    """Anthropic's stream carries the input as `partial_json` text; its answer and Ollama's carry an object, whose
    values stay as written (1.0 a float, the integer whole)."""
    client, _ = served
    tool = {"name": "f", "input_schema": PARAMETERS}
    body = {"model": "m", "messages": ASK, "max_tokens": 9, "tools": [tool]}
    resp = await client.post("/v1/messages", json={**body, "stream": True})
    partial = [e["delta"]["partial_json"] for e in _events(await resp.text())
               if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"]
    assert "".join(partial) == RAW
    resp = await client.post("/v1/messages", json=body)
    [block] = [b for b in (await resp.json())["content"] if b["type"] == "tool_use"]
    assert _typed(block["input"]) == _typed(json.loads(RAW))
    resp = await client.post("/api/chat", json={"model": "m", "messages": ASK, "tools": [TOOL], "stream": False})
    arguments = (await resp.json())["message"]["tool_calls"][0]["function"]["arguments"]
    assert _typed(arguments) == _typed(json.loads(RAW))


def _typed(value: object) -> object:
    """Each value with its type: 1.0 == 1 in Python, a float turned integer is not the same value on the wire."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return type(value).__name__, value


async def test_coerced_arguments_are_written_anew(served: tuple[TestClient, FakeOpenAI]) -> None:
    """Only what Velo changed is serialized again: "5" for an integer becomes 5, the rest as it now is."""
    client, up = served
    up.script.tool_calls = [{"name": "f", "arguments": '{"id": "5",  "path": "caf\\u00e9"}'}]
    assert json.loads(arguments := await _chat_arguments(client, False)) == {"id": 5, "path": "café"}
    assert arguments == '{"id":5,"path":"café"}'


async def test_a_cached_answer_keeps_the_text() -> None:
    async with FakeOpenAI(models=["m"]) as up:
        up.script.tool_calls = [{"name": "f", "arguments": RAW}]
        config = Config(backends=[BackendConfig(name="up", kind="openai", urls=[up.url])], default_backend="up",
                        cache=CacheConfig())
        async with TestClient(TestServer(make_app(config))) as client:
            assert await _chat_arguments(client, False, temperature=0) == RAW
            resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "tools": [TOOL],
                                                                   "temperature": 0})
            assert resp.headers["X-Velo-Cache"] == "exact"
            assert (await resp.json())["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == RAW


ARGS = '{"path": "caf\\u00e9.txt",  "n": 1.0, "big": 1e5, "a": {"arguments": {"x": 1}}}'


@pytest.mark.parametrize("reply", [
    '<tool_call>\n{"name": "f", "arguments": %s}\n</tool_call>' % ARGS,  # Hermes, Qwen
    '<tool_call>\n{"arguments": %s, "name": "f"}\n</tool_call>' % ARGS,  # not the last member
    '{"arguments": {"n": 2}, "name": "f", "why": "arguments", "arguments": %s }' % ARGS,  # orjson reads the last
    'Sure.\n```json\n[{"name": "f", "arguments": %s}]\n```' % ARGS,
    '[TOOL_CALLS] [{"name": "f", "arguments": %s}]' % ARGS,  # Mistral v3
    '<tool_call>\n{"name": "f", "arguments": %s}\n{"name": "f", "arguments": %s}\n</tool_call>' % (ARGS, ARGS),
    '<function=f>\n%s\n</function>' % ARGS,  # Llama 3.x
    '[TOOL_CALLS]f[ARGS]%s' % ARGS])  # Mistral v11
@pytest.mark.parametrize("stream", [False, True])
async def test_calls_written_as_text_keep_their_arguments_text(served: tuple[TestClient, FakeOpenAI], reply: str,
                                                              stream: bool) -> None:
    """The model's own spelling of the arguments, where they needed no repair: the in-process engine's calls, and
    every backend's that leaves them in the text."""
    client, up = served
    up.script.tool_calls, up.script.reply = [], reply
    calls = await _chat_arguments_all(client, stream)
    assert calls and all(c == ARGS for c in calls), calls


async def test_calls_written_as_text_and_repaired_are_written_anew(served: tuple[TestClient, FakeOpenAI]) -> None:
    client, up = served
    up.script.tool_calls = []
    up.script.reply = '<tool_call>{"name": "f", "arguments": {"path": "caf\\u00e9",}}'  # repaired: a trailing comma
    assert await _chat_arguments_all(client, False) == ['{"path":"café"}']


async def _chat_arguments_all(client: TestClient, stream: bool) -> list[str]:
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "tools": [TOOL],
                                                           "stream": stream})
    assert resp.status == 200, await resp.text()
    if not stream:
        return [c["function"]["arguments"] for c in (await resp.json())["choices"][0]["message"]["tool_calls"]]
    calls: dict[int, str] = {}
    for e in _events(await resp.text()):
        for ch in e["choices"]:
            for c in ch["delta"].get("tool_calls") or []:
                calls[c["index"]] = calls.get(c["index"], "") + c["function"].get("arguments", "")
    return list(calls.values())
