"""Velo's OpenAI API against the `openai` package's models, over every backend kind, streamed and not, fresh and
replayed; the stream's order as OpenAI sends it (a role delta first, `finish_reason` alone in its own chunk, the
usage chunk, `[DONE]`)."""
from __future__ import annotations

import pytest
from openai.types import Completion, CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.conformance import fields
from tests.conformance.conftest import CHAT_MODELS, EMBED_MODELS
from tests.conformance.wire import answer, call

pytestmark = pytest.mark.slow
LIMIT = 8
ASK = {"temperature": 0, "max_tokens": LIMIT}
ROUTES = {"/v1/chat/completions": ({"messages": [{"role": "user", "content": "Name three colours."}]},
                                   ChatCompletion, ChatCompletionChunk),
          "/v1/completions": ({"prompt": "Three colours are"}, Completion, Completion)}
ERROR = {"error": fields.F(dict, shape={"message": fields.F(str), "type": fields.F(str),
                                        "param": fields.F((str, type(None))), "code": fields.F((str, type(None)))})}


def text_of(choice: dict) -> str:
    return choice["message"]["content"] if "message" in choice else choice.get("delta", {}).get("content") \
        or choice.get("text", "")


@pytest.mark.parametrize("mode", ["fresh", "replay"])
@pytest.mark.parametrize("backend", list(CHAT_MODELS))
@pytest.mark.parametrize("path", list(ROUTES))
async def test_whole_answers(velo, path, backend, mode):
    base, whole, _ = ROUTES[path]
    body = {**base, **ASK, "model": CHAT_MODELS[backend]}
    obj = (await answer(velo, path, body, mode, warm=body)).json()
    assert fields.check_openai(obj, whole) == []
    choice, usage = obj["choices"][0], obj["usage"]
    assert text_of(choice) and choice["finish_reason"] in ("stop", "length")
    assert usage["completion_tokens"] == LIMIT if choice["finish_reason"] == "length" \
        else usage["completion_tokens"] <= LIMIT
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and usage["prompt_tokens"]


@pytest.mark.parametrize("mode", ["fresh", "replay"])
@pytest.mark.parametrize("backend", list(CHAT_MODELS))
@pytest.mark.parametrize("path", list(ROUTES))
async def test_streams(velo, path, backend, mode):
    base, _, chunk = ROUTES[path]
    body = {**base, **ASK, "model": CHAT_MODELS[backend], "seed": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    got = await answer(velo, path, body, mode, warm={k: v for k, v in body.items() if not k.startswith("stream")})
    assert got.headers["Content-Type"].startswith("text/event-stream")
    *events, done = got.sse()
    assert done == "[DONE]"
    for event in events:
        assert fields.check_openai(_final_typed(event), chunk) == []
    *choices, usage = events
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] <= LIMIT
    *texts, last = [c["choices"][0] for c in choices]
    assert last["finish_reason"] in ("stop", "length") and not text_of(last)
    assert last.get("delta", {}) == {} or "text" in last  # chat: an empty delta; completions: empty text
    assert all(c["finish_reason"] is None for c in texts) and any(text_of(c) for c in texts)
    if chunk is ChatCompletionChunk:
        assert texts[0]["delta"]["role"] == "assistant"
        assert all(text_of(c) for c in texts[1:])  # no empty deltas after the opening one
    assert len({c["id"] for c in choices}) == 1


def _final_typed(event: dict) -> dict:
    """OpenAI streams completions with `finish_reason: null` until the end, where the SDK's Completion model types
    only the final value: check a mid-stream chunk as if it were final."""
    if event.get("object") != "text_completion":
        return event
    return {**event, "choices": [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in event["choices"]]}


@pytest.mark.parametrize("backend", ["engine", "llamacpp", "openai"])
async def test_completion_logprobs(velo, backend):
    body = {"prompt": "Three colours are", **ASK, "model": CHAT_MODELS[backend], "logprobs": 2}
    obj = (await answer(velo, "/v1/completions", body, "fresh", {})).json()
    assert fields.check_openai(obj, Completion) == []
    lp = obj["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) > 0
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert all(p <= 0 for p in lp["token_logprobs"]) and all(1 <= len(t) <= 2 for t in lp["top_logprobs"])


@pytest.mark.parametrize("backend", ["engine", "llamacpp", "openai"])
@pytest.mark.parametrize("top", [None, 0, 2])
async def test_chat_logprobs_give_the_alternatives_asked_for(velo, backend, top):
    """`logprobs: true` gives each token's logprob with `top_logprobs` alternatives, none when it names no count, as
    OpenAI answers. Over an OpenAI-compatible llama-server a count of 0 gave `logprobs: null` and none gave 20."""
    asked = {"logprobs": True} | ({} if top is None else {"top_logprobs": top})
    body = {**ROUTES["/v1/chat/completions"][0], **ASK, "model": CHAT_MODELS[backend], **asked}
    obj = (await answer(velo, "/v1/chat/completions", body, "fresh", {})).json()
    assert fields.check_openai(obj, ChatCompletion) == []
    content = obj["choices"][0]["logprobs"]["content"]
    assert content and {len(t["top_logprobs"]) for t in content} == {top or 0}
    cmpl = {"prompt": "Three colours are", **ASK, "model": CHAT_MODELS[backend], "logprobs": top or 0}
    lp = (await answer(velo, "/v1/completions", cmpl, "fresh", {})).json()["choices"][0]["logprobs"]
    assert lp["tokens"] and all(len(t) <= (top or 0) for t in lp["top_logprobs"])  # a dict: alike tokens are one


async def test_models(velo):
    listed = (await call(velo, "GET", "/v1/models")).json()
    assert listed["object"] == "list" and listed["data"]
    for model in listed["data"]:
        assert fields.check_openai(model, Model) == []
    one = await call(velo, "GET", f"/v1/models/{CHAT_MODELS['engine']}")
    assert fields.check_openai(one.json(), Model) == []


@pytest.mark.parametrize("backend", list(EMBED_MODELS))
async def test_embeddings(velo, backend):
    got = await call(velo, "POST", "/v1/embeddings", {"model": EMBED_MODELS[backend], "input": ["red", "green"]})
    assert got.status == 200 and fields.check_openai(got.json(), CreateEmbeddingResponse) == []


@pytest.mark.parametrize("body, status, code, param", [
    ({"model": "no-such-model"}, 404, "model_not_found", None),
    ({"temperature": 2.5}, 400, None, "temperature"),
    ({"stream_options": {"include_usage": True}}, 400, None, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": True}, "n": 0}, 400, None, "n"),
])
async def test_errors(velo, body, status, code, param):
    request = {"model": CHAT_MODELS["engine"], "messages": [{"role": "user", "content": "hi"}], **body}
    got = await call(velo, "POST", "/v1/chat/completions", request)
    err = got.json()
    assert got.status == status and fields.check(err, ERROR) == []
    assert err["error"]["code"] == code and err["error"]["param"] == param
    assert err["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("backend", ["engine", "llamacpp", "openai"])
async def test_forced_tool_calls(velo, backend):
    """A forced call: `tool_calls` with string arguments, finish_reason "tool_calls", alone in the last chunk."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False}}}
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "model": CHAT_MODELS[backend],
            "temperature": 0, "max_tokens": 40, "tools": [weather], "tool_choice": "required"}
    whole = (await answer(velo, "/v1/chat/completions", body, "fresh", {})).json()
    assert fields.check_openai(whole, ChatCompletion) == []
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert whole["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    *events, done = (await answer(velo, "/v1/chat/completions", {**body, "stream": True}, "fresh", {})).sse()
    for event in events:
        assert fields.check_openai(event, ChatCompletionChunk) == []
    last = events[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["delta"] == {}
    assert [c["function"]["name"] for e in events for c in e["choices"][0]["delta"].get("tool_calls", [])] == [
        "get_weather"]
