"""Velo's Ollama API against api/types.go, over every backend kind, streamed and not, fresh and replayed."""
from __future__ import annotations

import orjson
import pytest

from tests.conformance import fields
from tests.conformance.conftest import CHAT_MODELS, EMBED_MODELS
from tests.conformance.wire import answer, call

pytestmark = pytest.mark.slow
LIMIT = 8
ASK = {"options": {"temperature": 0, "num_predict": LIMIT}}
ROUTES = {"/api/chat": ({"messages": [{"role": "user", "content": "Name three colours."}]}, fields.CHAT_RESPONSE),
          "/api/generate": ({"prompt": "Name three colours."}, fields.GENERATE_RESPONSE)}


def text_of(line: dict) -> str:
    return line["message"]["content"] if "message" in line else line["response"]


def check_final(line: dict, spec: dict) -> None:
    assert fields.check(line, spec) == []
    assert line["done"] is True and line["done_reason"] in ("stop", "length") and fields.rfc3339(line["created_at"])
    assert {"total_duration", "prompt_eval_count", "eval_count", "eval_duration"} <= line.keys()
    assert line["eval_count"] == LIMIT if line["done_reason"] == "length" else line["eval_count"] <= LIMIT
    assert 0 <= line.get("eval_duration", 0) <= line["total_duration"]


@pytest.mark.parametrize("mode", ["fresh", "replay"])
@pytest.mark.parametrize("backend", list(CHAT_MODELS))
@pytest.mark.parametrize("path", list(ROUTES))
async def test_whole_answers(velo, path, backend, mode):
    base, spec = ROUTES[path]
    body = {**base, **ASK, "model": CHAT_MODELS[backend], "stream": False}
    got = await answer(velo, path, body, mode, warm=body)
    line = got.json()
    check_final(line, spec)
    assert text_of(line) and line["model"] == CHAT_MODELS[backend]


@pytest.mark.parametrize("mode", ["fresh", "replay"])
@pytest.mark.parametrize("backend", list(CHAT_MODELS))
@pytest.mark.parametrize("path", list(ROUTES))
async def test_streams(velo, path, backend, mode):
    """Every line but the last carries text; the last carries none, and the metrics (Ollama's shape exactly)."""
    base, spec = ROUTES[path]
    body = {**base, **ASK, "model": CHAT_MODELS[backend], "options": {**ASK["options"], "seed": 11}}
    got = await answer(velo, path, body, mode, warm={**body, "stream": False})
    assert got.headers["Content-Type"].startswith("application/x-ndjson")
    *lines, last = got.ndjson()
    for line in lines:
        assert fields.check(line, spec) == [] and line["done"] is False
        assert text_of(line) or line.get("message", {}).get("thinking"), line  # no empty lines
        assert not line.keys() & {"done_reason", *fields.METRICS}
    check_final(last, spec)
    assert text_of(last) == "" and len(lines) >= 1


@pytest.mark.parametrize("mode", ["fresh", "replay"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("backend", list(CHAT_MODELS))
@pytest.mark.parametrize("path", list(ROUTES))
async def test_logprobs(velo, path, backend, stream, mode):
    """Ollama 0.12.11's `logprobs`: an entry per generated token with the alternatives asked for, in api/types.go's
    shape; streamed, each line carries its own tokens; replayed from the cache, the same."""
    base, spec = ROUTES[path]
    body = {**base, **ASK, "model": CHAT_MODELS[backend], "stream": stream, "logprobs": True, "top_logprobs": 2}
    got = await answer(velo, path, body, mode, warm=body)
    lines = got.ndjson() if stream else [got.json()]
    assert all(fields.check(line, spec) == [] for line in lines)
    entries = [e for line in lines for e in line.get("logprobs", [])]
    # An answer cut at the limit has an entry per token counted; one that ended itself may also count its end of
    # turn, which has no text (llama-server counts it, with a prompt cache that made the greedy answer end early).
    ended = lines[-1]["done_reason"] == "stop"
    assert 0 < len(entries) and lines[-1]["eval_count"] - len(entries) in ((0, 1) if ended else (0,))
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 and e["bytes"] == list(e["token"].encode())
               for e in entries)
    assert "".join(e["token"] for e in entries) == "".join(text_of(line) for line in lines)
    if stream:
        assert all("".join(e["token"] for e in line.get("logprobs", [])) == text_of(line) for line in lines)


@pytest.mark.parametrize("backend", list(CHAT_MODELS))
async def test_streamed_text_equals_the_whole_answer(velo, backend):
    """A client that appends text only while `done` is false gets all of it."""
    body = {**ROUTES["/api/chat"][0], **ASK, "model": CHAT_MODELS[backend], "options": {**ASK["options"], "seed": 3}}
    whole = (await answer(velo, "/api/chat", {**body, "stream": False}, "fresh", {})).json()
    lines = (await answer(velo, "/api/chat", body, "fresh", {})).ndjson()
    assert "".join(text_of(x) for x in lines if not x["done"]) == text_of(whole)


async def test_model_lists_and_version(velo):
    tags = (await call(velo, "GET", "/api/tags")).json()
    assert fields.check(tags, fields.LIST_RESPONSE) == []
    listed = set(CHAT_MODELS.values()) - {CHAT_MODELS["openai"]}  # Ollama lists every name with its tag
    assert {name if ":" in name else f"{name}:latest" for name in listed} <= {m["name"] for m in tags["models"]}
    assert all(fields.rfc3339(m["modified_at"]) for m in tags["models"])
    assert fields.check((await call(velo, "GET", "/api/version")).json(), fields.VERSION_RESPONSE) == []
    ps = (await call(velo, "GET", "/api/ps")).json()
    assert ps["models"] and fields.check(ps, fields.PROCESS_RESPONSE) == []
    assert all(fields.rfc3339(m["expires_at"]) for m in ps["models"])


@pytest.mark.parametrize("backend", list(CHAT_MODELS))
async def test_show(velo, backend):
    got = await call(velo, "POST", "/api/show", {"model": CHAT_MODELS[backend]})
    assert got.status == 200 and fields.check(got.json(), fields.SHOW_RESPONSE) == []
    assert "completion" in got.json()["capabilities"] and "embedding" not in got.json()["capabilities"]


@pytest.mark.parametrize("backend", list(EMBED_MODELS))
async def test_embeddings(velo, backend):
    got = await call(velo, "POST", "/api/embed", {"model": EMBED_MODELS[backend], "input": ["red", "green"]})
    assert got.status == 200 and fields.check(got.json(), fields.EMBED_RESPONSE) == []
    assert len(got.json()["embeddings"]) == 2
    legacy = await call(velo, "POST", "/api/embeddings", {"model": EMBED_MODELS[backend], "prompt": "red"})
    assert legacy.status == 200 and fields.check(legacy.json(), fields.EMBEDDING_RESPONSE) == []


@pytest.mark.parametrize("path, body, status", [
    ("/api/chat", {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, 404),
    ("/api/generate", {"model": "no-such-model", "prompt": "hi"}, 404),
    ("/api/chat", {"model": CHAT_MODELS["engine"], "messages": "hi"}, 400),
    ("/api/show", {}, 400),
])
async def test_errors(velo, path, body, status):
    got = await call(velo, "POST", path, body)
    assert got.status == status and fields.check(got.json(), fields.ERROR) == []


@pytest.mark.parametrize("backend", ["engine", "llamacpp"])
async def test_structured_output_streams_token_by_token(velo, backend):
    """Backends that decode `format` under a grammar stream it as Ollama does, not in one line at the end."""
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"]}
    body = {**ROUTES["/api/chat"][0], "model": CHAT_MODELS[backend], "format": schema,
            "options": {"temperature": 0, "num_predict": 16}}
    *lines, last = (await answer(velo, "/api/chat", body, "fresh", {})).ndjson()
    text = "".join(text_of(x) for x in lines)
    assert len(lines) > 3 and text.replace(" ", "").replace("\n", "").startswith('{"colour"')
    assert last["done_reason"] == "length" or isinstance(orjson.loads(text)["colour"], str)


async def test_tool_calls(velo, ollama_upstream):
    """`message.tool_calls` as types.go has them (object arguments, an index), streamed and not."""
    ollama_upstream.script.tool_calls = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    body = {**ROUTES["/api/chat"][0], **ASK, "model": CHAT_MODELS["ollama"], "tools": [weather]}
    try:
        whole = (await answer(velo, "/api/chat", {**body, "stream": False}, "fresh", {})).json()
        lines = (await answer(velo, "/api/chat", body, "fresh", {})).ndjson()
    finally:
        ollama_upstream.script.tool_calls = []
    for line in (whole, *lines):
        assert fields.check(line, fields.CHAT_RESPONSE) == []
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    for answer_calls in (calls, whole["message"]["tool_calls"]):  # each call has its own id, as routes.go gives
        [call] = answer_calls
        assert call.pop("id").startswith("call_")
        assert call == {"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}
    assert lines[-1]["done"] and "tool_calls" not in lines[-1]["message"]
