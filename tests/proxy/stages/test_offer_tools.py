"""Tools reach every model: natively, written into the prompt, or as a constrained call; X-Velo-Tools says which,
and calls the model writes as text come back to every dialect as structured calls."""
from __future__ import annotations

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.tool_prompt import call_schema
from proxy.app import make_app
from proxy.config import Config
from tests.scripted import ScriptedBackend

READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
ASK = [{"role": "user", "content": "Read notes.txt"}]
TAGGED = '<tool_call>\n{"name": "read_file", "arguments": {"path": "notes.txt"}}\n</tool_call>'


class Forcing(ScriptedBackend):
    forces_tool_choice = True  # as the engine and vLLM do


async def velo(backend: ScriptedBackend) -> TestClient:
    client = TestClient(TestServer(make_app(Config(), {"s": backend})))
    await client.start_server()
    return client


async def test_a_template_that_renders_tools_gets_them_natively():
    backend = ScriptedBackend("s")
    async with await velo(backend) as c:
        resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "tools": [READ]})
    assert resp.status == 200 and resp.headers["X-Velo-Tools"] == "native"
    req = backend.requests[0]
    assert req.tools[0].name == "read_file" and not req.tools_in_prompt and req.format is None


@pytest.mark.parametrize("path, body, calls", [
    ("/v1/chat/completions", {"tools": [READ]},
     lambda r: [(c["function"]["name"], orjson.dumps(orjson.loads(c["function"]["arguments"])).decode())
                for c in r["choices"][0]["message"]["tool_calls"]]),  # the text as the model wrote it: its values
    ("/api/chat", {"tools": [READ], "stream": False},
     lambda r: [(c["function"]["name"], orjson.dumps(c["function"]["arguments"]).decode())
                for c in r["message"]["tool_calls"]]),
    ("/v1/messages", {"max_tokens": 64, "tools": [{"name": "read_file", "description": "Read a file",
                                                    "input_schema": READ["function"]["parameters"]}]},
     lambda r: [(b["name"], orjson.dumps(b["input"]).decode()) for b in r["content"] if b["type"] == "tool_use"]),
])
async def test_a_template_that_ignores_tools_gets_them_in_the_prompt(path, body, calls):
    backend = ScriptedBackend("s", capabilities=("completion",))
    backend.script.pieces = ["I will read it.\n", TAGGED]
    async with await velo(backend) as c:
        resp = await c.post(path, json={"model": "tiny", "messages": ASK, **body})
        answer = await resp.json()
    assert resp.status == 200 and resp.headers["X-Velo-Tools"] == "prompt"
    assert backend.requests[0].tools_in_prompt and backend.requests[0].tools[0].name == "read_file"
    assert calls(answer) == [("read_file", '{"path":"notes.txt"}')]


async def test_a_required_call_on_a_backend_that_would_answer_in_prose_is_constrained_to_its_schema():
    backend = ScriptedBackend("s")
    backend.script.pieces = ['{"name": "read_file", "arguments": {"path": "notes.txt"}}']
    async with await velo(backend) as c:
        resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "tools": [READ],
                                                          "tool_choice": "required"})
        answer = await resp.json()
    assert resp.status == 200 and resp.headers["X-Velo-Tools"] == "grammar"
    req = backend.requests[0]
    assert req.tools_in_prompt and req.format == call_schema(req.tools)
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"


async def test_a_backend_that_enforces_tool_choice_keeps_it():
    backend = Forcing("s")
    async with await velo(backend) as c:
        resp = await c.post("/v1/chat/completions", json={
            "model": "tiny", "messages": ASK, "tools": [READ],
            "tool_choice": {"type": "function", "function": {"name": "read_file"}}})
    assert resp.headers["X-Velo-Tools"] == "grammar"
    req = backend.requests[0]
    assert not req.tools_in_prompt and req.format is None and req.tool_choice["function"]["name"] == "read_file"


async def test_no_tools_on_offer_means_no_header():
    backend = ScriptedBackend("s")
    async with await velo(backend) as c:
        resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "tools": [READ],
                                                          "tool_choice": "none"})
    assert "X-Velo-Tools" not in resp.headers and not backend.requests[0].tools_in_prompt
