"""`parallel_tool_calls: false` and Anthropic's `disable_parallel_tool_use`: the first call comes back, the rest are
dropped (named in X-Velo-Repair of a whole answer), streamed or not, in every dialect that can ask; one cached
answer serves both."""
from __future__ import annotations

import anthropic
import openai
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.protocol import ToolCall
from proxy.app import make_app
from proxy.config import Config
from tests.scripted import ScriptedBackend

READ = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
ASK = [{"role": "user", "content": "Read a.txt and b.txt"}]


@pytest.fixture
async def velo():
    backend = ScriptedBackend("s")
    backend.script.tool_calls = [ToolCall("read_file", {"path": "a.txt"}, "call_a"),
                                 ToolCall("read_file", {"path": "b.txt"}, "call_b")]
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as client:
        yield client


def _base(client: TestClient) -> str:
    return str(client.make_url("")).rstrip("/")


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat_gets_the_first_call_only_when_asked(velo, stream):
    async def paths(**kw) -> tuple[list[dict], str]:
        resp = await velo.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "tools": [READ],
                                                             "stream": stream, **kw})
        if stream:
            events = [orjson.loads(line[6:]) for line in (await resp.text()).splitlines()
                      if line.startswith("data: {")]
            calls = [c for e in events for c in e["choices"][0]["delta"].get("tool_calls") or []]
        else:
            calls = (await resp.json())["choices"][0]["message"]["tool_calls"]
        return [orjson.loads(c["function"]["arguments"]) for c in calls], resp.headers.get("X-Velo-Repair", "")

    one, repair = await paths(parallel_tool_calls=False)
    assert one == [{"path": "a.txt"}] and ("parallel_calls_dropped=1" in repair) is not stream  # a stream's headers
    # went out before the calls came
    both, repair = await paths()  # the same question, parallel calls allowed: answered from the cache, whole
    assert both == [{"path": "a.txt"}, {"path": "b.txt"}] and "parallel_calls_dropped" not in repair


async def test_anthropic_disable_parallel_tool_use(velo):
    sdk = anthropic.AsyncAnthropic(base_url=_base(velo), api_key="k", max_retries=0)
    tool = {"name": "read_file", "input_schema": READ["function"]["parameters"]}
    msg = await sdk.messages.create(model="tiny", max_tokens=64, messages=ASK, tools=[tool],
                                    tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [b.input for b in msg.content if b.type == "tool_use"] == [{"path": "a.txt"}]
    msg = await sdk.messages.create(model="tiny", max_tokens=64, messages=ASK, tools=[tool])
    assert len([b for b in msg.content if b.type == "tool_use"]) == 2


async def test_responses_parallel_tool_calls_false(velo):
    sdk = openai.AsyncOpenAI(base_url=_base(velo) + "/v1", api_key="k", max_retries=0)
    tool = {"type": "function", "name": "read_file", "parameters": READ["function"]["parameters"]}
    r = await sdk.responses.create(model="tiny", input="Read a.txt and b.txt", tools=[tool],
                                   parallel_tool_calls=False)
    assert [i.call_id for i in r.output if i.type == "function_call"] == ["call_a"] and not r.parallel_tool_calls
