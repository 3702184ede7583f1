"""A tool call a client sends back in its history reaches the backend as the client sent it. The dialect parsed the
arguments string and the adapter wrote it again: `{"path": "caf\\u00e9.txt",  "n": 1.0}` the model had generated
went back as `{"path":"café.txt","n":1.0}`, which llama-server's prompt cache and vLLM's prefix cache (both compare
tokens) no longer matched from that turn on. Calls a dialect carries as objects (Anthropic's) are written anew."""
from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from proxy.cache.config import CacheConfig
from tests.fakes import FakeOpenAI

RAW = '{"path": "caf\\u00e9.txt",  "n": 1.0}'
PARAMETERS = {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "number"}}}
TOOL = {"type": "function", "function": {"name": "read", "parameters": PARAMETERS}}


@pytest.fixture
def served_cache() -> CacheConfig:
    """The cache on: a history call spelled otherwise must be another entry."""
    return CacheConfig()


def _history(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": arguments}}
    return [{"role": "user", "content": "read it"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "hello"}]


def _sent_arguments(up: FakeOpenAI) -> list[str]:
    return [c["function"]["arguments"] for m in up.last("/v1/chat/completions")["messages"]
            for c in m.get("tool_calls") or []]


async def _chat(client: TestClient, messages: list[dict[str, Any]], **extra: Any) -> str:
    resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "tools": [TOOL],
                                                           **extra})
    assert resp.status == 200, await resp.text()
    return resp.headers.get("X-Velo-Cache", "")


async def test_chat_history_calls_reach_the_backend_as_sent(served: tuple[TestClient, FakeOpenAI]) -> None:
    client, up = served
    await _chat(client, _history(RAW))
    assert _sent_arguments(up) == [RAW]
    legacy = [{"role": "user", "content": "read it"},
              {"role": "assistant", "content": None, "function_call": {"name": "read", "arguments": RAW}},
              {"role": "function", "name": "read", "content": "hello"}]
    await _chat(client, legacy)
    assert _sent_arguments(up) == [RAW]


async def test_a_history_call_spelled_otherwise_is_another_cache_entry(served: tuple[TestClient, FakeOpenAI]) -> None:
    """The backend reads another text, so its answer may differ: the spelling is part of the exact key."""
    client, up = served
    assert await _chat(client, _history(RAW), temperature=0) != "exact"
    assert await _chat(client, _history(RAW), temperature=0) == "exact"
    assert await _chat(client, _history('{"path":"café.txt","n":1.0}'), temperature=0) != "exact"
    assert _sent_arguments(up) == ['{"path":"café.txt","n":1.0}']


async def test_calls_sent_as_objects_are_written_anew(served: tuple[TestClient, FakeOpenAI]) -> None:
    """Anthropic's tool_use carries an object: there is no text to keep, its values are written compactly."""
    client, up = served
    messages = [{"role": "user", "content": "read it"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read",
                                                   "input": {"path": "café.txt", "n": 1.0}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"}]}]
    resp = await client.post("/v1/messages", json={"model": "m", "max_tokens": 9, "messages": messages,
                                                   "tools": [{"name": "read", "input_schema": PARAMETERS}]})
    assert resp.status == 200, await resp.text()
    assert _sent_arguments(up) == ['{"path":"café.txt","n":1.0}']


async def test_responses_history_calls_reach_the_backend_as_sent(served: tuple[TestClient, FakeOpenAI]) -> None:
    client, up = served
    items = [{"role": "user", "content": "read it"},
             {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": RAW},
             {"type": "function_call_output", "call_id": "call_1", "output": "hello"}]
    resp = await client.post("/v1/responses", json={"model": "m", "input": items,
                                                    "tools": [{"type": "function", **TOOL["function"]}]})
    assert resp.status == 200, await resp.text()
    assert _sent_arguments(up) == [RAW]
