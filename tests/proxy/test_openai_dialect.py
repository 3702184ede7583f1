"""The OpenAI API under /v1, driven by the real `openai` client package, plus raw-wire checks of the SSE shape."""
from __future__ import annotations

import asyncio
import base64
import struct

import openai
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from adapters.llamacpp import LlamaCppBackend
from adapters.protocol import Chunk, TokenLogprob, ToolCall
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config
from proxy.dialects import openai as openai_dialect
from tests.scripted import ScriptedBackend


def _client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)


async def test_chat_non_stream_with_options(base_url, scripted: ScriptedBackend):
    out = await _client(base_url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=9, temperature=0.5,
        top_p=0.9, stop=["END"], seed=3, presence_penalty=0.1, frequency_penalty=0.2)
    assert out.choices[0].message.content == "Hello world" and out.choices[0].finish_reason == "stop"
    assert out.usage.prompt_tokens == 5 and out.usage.completion_tokens == 3
    o = scripted.requests[0].options
    assert (o.max_tokens, o.temperature, o.top_p, o.stop, o.seed, o.presence_penalty, o.frequency_penalty) == \
        (9, 0.5, 0.9, ["END"], 3, 0.1, 0.2)


async def test_chat_stream_with_usage_and_tool_calls(base_url, scripted: ScriptedBackend):
    scripted.script.tool_calls = [ToolCall(name="lookup", arguments={"q": "velo"}, id="call_1")]
    stream = await _client(base_url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True},
        tools=[{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}])
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "lookup" and orjson.loads(calls[0].function.arguments) == {"q": "velo"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 8
    assert {c.system_fingerprint for c in chunks} == {"velo"}  # the usage chunk's too, as every other chunk's


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                                        ("/v1/completions", {"prompt": "hi"})])
async def test_with_include_usage_every_other_chunk_has_a_null_usage(client, path, body):
    """OpenAI's reference: with `include_usage`, "all other chunks will also include a usage field, but with a null
    value"; they had none. Without it, no chunk has the field."""
    for include in (True, False):
        resp = await client.post(path, json={"model": "tiny", "stream": True, "n": 2, **body,
                                             "stream_options": {"include_usage": include}})
        events = [orjson.loads(line[6:]) for line in (await resp.read()).splitlines() if line.startswith(b"data: {")]
        *choices, last = events
        assert all(("usage" in e, e.get("usage")) == (include, None) for e in choices) and len(choices) > 2
        assert (last["choices"], last.get("usage", {}).get("total_tokens")) == (([], 11) if include else
                                                                                (last["choices"], None))


async def test_parallel_calls_stream_one_an_event_index_counting_on(client, scripted: ScriptedBackend):
    """OpenAI, llama-server and vLLM stream each call in an event of its own; gptel reads only an event's first call
    (`tool_calls[0]`) and ran one of two."""
    scripted.script.tool_calls = [ToolCall("read_file", {"path": "a.py"}, id="call_a"),
                                  ToolCall("read_file", {"path": "b.py"}, id="call_b")]
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "stream": True, "tools": [
        {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}],
        "messages": [{"role": "user", "content": "hi"}]})
    events = [orjson.loads(line[6:]) for line in (await resp.read()).splitlines() if line.startswith(b"data: {")]
    with_calls = [e["choices"][0]["delta"]["tool_calls"] for e in events if e["choices"][0]["delta"].get("tool_calls")]
    assert [[(c["index"], c["id"], c["function"]["arguments"]) for c in calls] for calls in with_calls] == [
        [(0, "call_a", '{"path":"a.py"}')], [(1, "call_b", '{"path":"b.py"}')]]
    assert [e["choices"][0]["finish_reason"] for e in events][-1] == "tool_calls"


async def test_the_openai_client_reads_parallel_calls_streamed_one_an_event(base_url, scripted: ScriptedBackend):
    scripted.script.tool_calls = [ToolCall("read_file", {"path": "a.py"}, id="call_a"),
                                  ToolCall("read_file", {"path": "b.py"}, id="call_b")]
    stream = await _client(base_url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
        tools=[{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}])
    deltas = [c.choices[0].delta.tool_calls async for c in stream if c.choices and c.choices[0].delta.tool_calls]
    assert [[(tc.index, tc.id, tc.function.arguments) for tc in calls] for calls in deltas] == [
        [(0, "call_a", '{"path":"a.py"}')], [(1, "call_b", '{"path":"b.py"}')]]


async def test_sse_wire_ends_with_done(client):
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "stream": True,
                                                          "messages": [{"role": "user", "content": "x"}]})
    assert resp.content_type == "text/event-stream"
    events = [e for e in (await resp.text()).split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)


async def test_n_choices_and_multimodal_parts(base_url, scripted: ScriptedBackend):
    out = await _client(base_url).chat.completions.create(
        model="tiny", n=2, seed=1, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is"}, {"type": "text", "text": " this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}]}])
    assert [c.index for c in out.choices] == [0, 1]
    assert scripted.requests[0].messages[0].content == "what is this?"
    assert scripted.requests[0].messages[0].images == ["QUJD"]
    assert {r.options.seed for r in scripted.requests} == {1, 2}


class _FirstSeedLate(ScriptedBackend):
    """Choice 0 (the request's own seed) starts answering after choice 1 has, as on a busier slot."""

    def chat(self, req):
        stream = super().chat(req)
        return _late(stream) if req.options.seed == 1 else stream


async def _late(stream):
    await asyncio.sleep(0.2)
    async for chunk in stream:
        yield chunk


async def test_streamed_choices_open_in_index_order_whichever_answers_first():
    """The openai package's stream helper files each choice where it first appears (its first chunk's choices by
    index, then appended): choice 1's role delta first, as it came first from the backend, failed
    `chat.completions.stream(n=2)` with an IndexError, and a third choice would have been merged into the second."""
    late = _FirstSeedLate()
    async with TestClient(TestServer(make_app(Config(cache=CacheConfig(enabled=False)), {"s": late}))) as c:
        oai = _client(str(c.make_url("")).rstrip("/"))
        async with oai.chat.completions.stream(model="tiny", n=3, seed=1,
                                               messages=[{"role": "user", "content": "hi"}]) as stream:
            indexes = [e.chunk.choices[0].index async for e in stream if e.type == "chunk" and e.chunk.choices]
            answer = await stream.get_final_completion()
    assert list(dict.fromkeys(indexes)) == [0, 1, 2] and indexes[-1] == 0  # choice 0 answered last
    assert [(c.index, c.message.content, c.finish_reason) for c in answer.choices] == [
        (i, "Hello world", "stop") for i in range(3)]


async def test_the_choices_seeds_stay_signed_64_bit_integers(base_url, scripted: ScriptedBackend):
    """OpenAI's seed and vLLM's (Field(le=2**63 - 1)) are signed 64-bit integers: `seed=sys.maxsize, n=2` gave the
    second choice 2**63, which vLLM refuses with a 400, so the request OpenAI answers failed. Each choice's seed wraps
    within them."""
    await _client(base_url).chat.completions.create(model="tiny", n=3, seed=2**63 - 2,
                                                    messages=[{"role": "user", "content": "hi"}])
    assert sorted(r.options.seed for r in scripted.requests) == [0, 2**63 - 2, 2**63 - 1]


async def test_assistant_tool_history_is_parsed(client, scripted: ScriptedBackend):
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})
    assert resp.status == 200
    parsed = scripted.requests[0].messages
    assert parsed[1].tool_calls[0].arguments == {"a": 1} and parsed[2].tool_call_id == "c1"


async def test_response_format_json_schema(client, scripted: ScriptedBackend):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    await client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
    await client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})
    # a bare schema in json_schema's place (Dify's OpenAI-compatible plugin): before, a 400
    await client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": schema}})
    assert [r.format for r in scripted.requests] == [schema, "json", schema]
    nameless = await client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s"}}})
    assert nameless.status == 400 and "json_schema.schema must be an object" in await nameless.text()


_NO_CALL = {"type": "object", "properties": {"code": {"type": "string", "minLength": 5, "maxLength": 2}},
            "required": ["code"]}


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"code": {"type": "string", "minLength": 5, "maxLength": 2}},
        "required": ["code"]}}}}, "response_format"),
    ("/api/chat", {"format": {"type": "string", "minLength": 5, "maxLength": 2}, "stream": False}, None),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "s", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 1}}, "required": ["n"]}}}},
     "text"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": _NO_CALL}}],
                              "tool_choice": "required"}, "tools"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": _NO_CALL}}]},
     "tools"),
    ("/api/chat", {"tools": [{"type": "function", "function": {"name": "f", "parameters": _NO_CALL}}],
                   "stream": False}, None),
    ("/v1/responses", {"tools": [{"type": "function", "name": "f", "parameters": _NO_CALL, "strict": True}],
                       "tool_choice": "required"}, "tools"),
    ("/v1/messages", {"max_tokens": 10, "tools": [{"name": "f", "input_schema": _NO_CALL}],
                      "tool_choice": {"type": "tool", "name": "f"}}, None),
])
async def test_a_schema_no_output_can_match_is_a_400_before_any_backend_gets_it(client, scripted, path, body, param):
    """Velo's engine said 400; llama-server grew by 0.5 GB a second building a grammar for it while the client
    waited for a 504, which the SDKs retried. A tool's parameters alike: llama-server builds a call's grammar from
    them, and a forced call of one no arguments can match killed it (the 502 of a closed connection, then 503s). The
    OpenAI error names the request's own field (it named Ollama's `format`)."""
    messages = {"input": "x"} if path == "/v1/responses" else {"messages": [{"role": "user", "content": "x"}]}
    resp = await client.post(path, json={"model": "tiny", **messages, **body})
    assert resp.status == 400 and "Unsatisfiable schema" in await resp.text() and scripted.requests == []
    if param is not None:
        assert (await resp.json())["error"]["param"] == param


@pytest.mark.parametrize("path, stream", [("/api/chat", False), ("/api/chat", True), ("/api/generate", False)])
async def test_an_ollama_format_no_output_can_match_is_named_in_ollamas_words(client, scripted, path, stream):
    """Ollama's error has no `param`: it says "invalid JSON schema in format", which clients look for. Velo's said
    "invalid output grammar: Unsatisfiable schema: ...", naming no field."""
    body = {"messages": [{"role": "user", "content": "x"}]} if path == "/api/chat" else {"prompt": "x"}
    resp = await client.post(path, json={"model": "tiny", **body, "stream": stream,
                                         "format": {"type": "string", "minLength": 5, "maxLength": 2}})
    error = (await resp.json())["error"]
    assert resp.status == 400 and scripted.requests == []
    assert error.startswith("invalid JSON schema in format: ") and "Unsatisfiable schema" in error


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"max_tokens": 10, "tools": [{"name": "f", "input_schema": {"type": "string"}}],
                      "tool_choice": {"type": "tool", "name": "f"}}),
    ("/v1/responses", {"tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}],
                       "tool_choice": "required"}),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": ["string", "null"]}}}]})])
async def test_tool_parameters_of_a_type_other_than_object_are_a_400(client, scripted, path, body):
    """A call's arguments are an object: Anthropic and OpenAI refuse other parameters with a 400. Velo passed them on,
    and the engine's forced call, written as a string, was a 502 ("arguments are not a JSON object")."""
    messages = {"input": "x"} if path == "/v1/responses" else {"messages": [{"role": "user", "content": "x"}]}
    resp = await client.post(path, json={"model": "tiny", **messages, **body, "stream": True})
    error = (await resp.json())["error"]
    assert resp.status == 400 and 'of type "object"' in error["message"] and scripted.requests == []


async def test_completions_fim_and_stream(base_url, scripted: ScriptedBackend):
    c = _client(base_url)
    out = await c.completions.create(model="tiny", prompt="def add(a, b):", suffix="\n", max_tokens=8)
    assert out.choices[0].text == "Hello world" and scripted.requests[0].suffix == "\n"
    stream = await c.completions.create(model="tiny", prompt="x", stream=True)
    assert "".join([ch.choices[0].text async for ch in stream]) == "Hello world"


async def test_completions_batch_one_choice_per_prompt_and_n(base_url, scripted: ScriptedBackend):
    """A prompt array is a batch: choices in prompt order, n each, and each prompt's tokens counted once."""
    c = _client(base_url)
    out = await c.completions.create(model="tiny", prompt=["One", "Two"], n=2, seed=7, echo=True)
    assert [(ch.index, ch.text) for ch in out.choices] == [
        (0, "OneHello world"), (1, "OneHello world"), (2, "TwoHello world"), (3, "TwoHello world")]
    assert [(r.prompt, r.options.seed) for r in scripted.requests] == [("One", 7), ("One", 8), ("Two", 7), ("Two", 8)]
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (10, 12)
    stream = await c.completions.create(model="tiny", prompt=["One", "Two"], stream=True,
                                        stream_options={"include_usage": True})
    texts: dict[int, str] = {}
    async for ch in stream:
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
        usage = ch.usage
    assert texts == {0: "Hello world", 1: "Hello world"} and usage.prompt_tokens == 10


async def test_completions_stream_echoes_the_prompt_first(client):
    """As OpenAI and vLLM stream it: the prompt is the choice's first text (with logprobs, echo is a 400: below)."""
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "Say", "echo": True, "stream": True})
    events = [orjson.loads(e[6:]) for e in (await resp.text()).split("\n\n") if e.startswith("data: {")]
    assert [e["choices"][0]["text"] for e in events][:2] == ["Say", "Hel"]
    assert "".join(e["choices"][0]["text"] for e in events) == "SayHello world"


async def test_echo_over_an_openai_compatible_backend_shows_the_prompt_once(openai_fake):
    """vLLM and SGLang echo the prompt when asked (the fake answers as they do) and llama-server does not: Velo
    echoes it itself and never asks the backend, so the prompt shows once over every backend."""
    openai_fake.script.reply = "lo world"
    cfg = Config(backends=[BackendConfig(name="up", kind="openai", urls=[openai_fake.url])],
                 cache=CacheConfig(enabled=False))
    async with TestClient(TestServer(make_app(cfg))) as c:
        body = {"model": "fake-gpt", "prompt": "Hel", "echo": True}
        assert (await (await c.post("/v1/completions", json=body)).json())["choices"][0]["text"] == "Hello world"
        text = await (await c.post("/v1/completions", json={**body, "stream": True})).text()
        events = [orjson.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
        assert "".join(e["choices"][0]["text"] for e in events) == "Hello world"
    assert all("echo" not in r.body for r in openai_fake.requests if r.path == "/v1/completions")


async def test_completions_take_token_ids_as_openai_does(base_url, scripted: ScriptedBackend):
    """OpenAI's `prompt` may be one prompt's token ids or a batch of them (lm-eval's local-completions sends ids by
    default); Velo refused every token array. They reach the backend as they are, counted as themselves."""
    c = _client(base_url)
    one = await c.completions.create(model="tiny", prompt=[9, 8, 7])
    batch = await c.completions.create(model="tiny", prompt=[[1, 2], [0, 2**31 - 1]], n=2, seed=1)
    assert [(r.prompt, r.prompt_ids) for r in scripted.requests] == [
        ("", [9, 8, 7]), ("", [1, 2]), ("", [1, 2]), ("", [0, 2**31 - 1]), ("", [0, 2**31 - 1])]
    assert one.choices[0].text == "Hello world" and [ch.index for ch in batch.choices] == [0, 1, 2, 3]
    stream = await c.completions.create(model="tiny", prompt=[5, 6], stream=True)
    assert "".join([ch.choices[0].text async for ch in stream]) == "Hello world"
    assert scripted.requests[-1].prompt_ids == [5, 6]


async def test_an_empty_string_in_a_batch_of_prompts_starts_a_new_document(client, scripted: ScriptedBackend):
    """Only an empty array of ids is no prompt: `[""]` was refused as "an empty array of token ids" once prompts
    could be ids, where "" alone, and in a batch before, started a new document as OpenAI's does."""
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": ["", "Once"]})
    assert resp.status == 200 and len((await resp.json())["choices"]) == 2
    assert [(r.prompt, r.prompt_ids) for r in scripted.requests] == [("", None), ("Once", None)]


async def test_a_prompt_of_token_ids_is_counted_as_its_ids_for_the_window(client, scripted: ScriptedBackend):
    """The fit stage counts ids as themselves: the backend's count_tokens reads the prompt's text, which is "" here,
    and let any number of ids through to the backend."""
    scripted.context_length = 16
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": list(range(20)), "max_tokens": 2})
    error = (await resp.json())["error"]
    assert resp.status == 400 and (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
    assert scripted.requests == []


@pytest.mark.parametrize("body, param, message", [
    ({"suffix": "x"}, "suffix", "suffix needs the prompt as text"),
    ({"echo": True}, "echo", "echo needs the prompt as text"),
])
async def test_token_ids_with_a_suffix_or_echo_are_a_400(client, scripted, body, param, message):
    """A middle's prompt is built from the prompt's text and the suffix's, and echo shows the prompt's text: Velo has
    neither for ids."""
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": [1, 2], **body})
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["param"] == param and message in error["message"]
    assert scripted.requests == []


@pytest.mark.parametrize("prompt, n, message", [
    ([], 1, "prompt must not be empty"),
    ([[]], 1, "empty array of token ids"),
    ([[1], []], 1, "empty array of token ids"),
    (["a", 2], 1, "prompt must be a string, an array of strings, an array of token ids"),
    ([1, "a"], 1, "an array of token ids (integers from 0 to 2147483647)"),
    ([[1], "a"], 1, "an array of such arrays"),
    ([-1], 1, "integers from 0"), ([2**31], 1, "integers from 0"), ([True], 1, "integers from 0"),
    ([1.0], 1, "integers from 0"), ([[[1]]], 1, "integers from 0"), ({"ids": [1]}, 1, "integers from 0"),
    (["a"] * 65, 1, "at most 64 choices"),
    (["a"] * 5, 16, "at most 64 choices"),
    ([[1]] * 5, 16, "at most 64 choices"),
])
async def test_completions_prompt_errors_are_400s(client, scripted, prompt, n, message):
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "n": n})
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["param"] == "prompt" and message in error["message"]
    assert scripted.requests == []


async def test_embeddings_float_and_base64(base_url):
    c = _client(base_url)
    out = await c.embeddings.create(model="tiny", input=["ab", "abcd"])
    assert [d.embedding[0] for d in out.data] == [2.0, 4.0]
    raw = await c.embeddings.with_raw_response.create(model="tiny", input="abc", encoding_format="base64")
    vec = struct.unpack("<3f", base64.b64decode(orjson.loads(raw.content)["data"][0]["embedding"]))
    assert vec == (3.0, 1.0, 0.0)


async def test_models_listing(base_url):
    c = _client(base_url)
    assert [(m.id, m.created) async for m in c.models.list()] == [("tiny:latest", 1714582800)]  # MODIFIED_AT
    assert (await c.models.retrieve("tiny:latest")).id == "tiny:latest"
    with pytest.raises(openai.NotFoundError) as e:
        await c.models.retrieve("nope")
    assert (e.value.code, e.value.type) == ("model_not_found", "invalid_request_error")  # as a chat's unknown model
    raw = await c.models.with_raw_response.list()
    assert raw.request_id == raw.headers["X-Velo-Request-Id"] and raw.request_id.startswith("req_")  # x-request-id
    assert e.value.request_id and e.value.request_id.startswith("req_")
    [listed] = raw.parse().data
    assert listed.meta == {"n_ctx": 8192}  # llama-server's: crush sizes its context by it


async def test_openais_routes_answer_without_v1_as_llama_servers_do(base_url, scripted: ScriptedBackend):
    """crush's llamacpp provider takes the server's URL without /v1: Velo answered its model listing and chats 404."""
    c = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    assert [m.id async for m in c.models.list()] == ["tiny:latest"]
    answer = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "Hello world"
    assert (await c.completions.create(model="tiny", prompt="x")).choices[0].text == "Hello world"
    assert len((await c.embeddings.create(model="tiny", input="ab")).data) == 1
    with pytest.raises(openai.BadRequestError) as e:  # errors in OpenAI's shape, not Ollama's
        await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=5)
    assert e.value.param == "temperature"


@pytest.mark.parametrize("body, param", [
    ({"input": "hi", "dimensions": 0}, "dimensions"), ({"input": ""}, "input"), ({"input": ["a", ""]}, "input"),
    ({"input": ["a"] * 2049}, "input")])
async def test_embeddings_outside_openais_bounds_are_a_400(client, scripted, body, param):
    """Before: the full vector for dimensions 0, "" embedded, any number of inputs."""
    resp = await client.post("/v1/embeddings", json={"model": "tiny", **body})
    assert resp.status == 400 and (await resp.json())["error"]["param"] == param and scripted.requests == []


async def test_embeddings_take_token_ids_as_openai_does(base_url, scripted):
    """OpenAI's `input` may be one input's token ids or several inputs' (the openai client sends them itself where
    tiktoken chunks a long text); Velo refused every token array."""
    c = _client(base_url)
    one = await c.embeddings.create(model="tiny", input=[9, 8, 7])
    many = await c.embeddings.create(model="tiny", input=[[1, 2], [3], [0, 5, 2**31 - 1]])
    assert [r.inputs for r in scripted.requests] == [[[9, 8, 7]], [[1, 2], [3], [0, 5, 2**31 - 1]]]
    assert len(one.data) == 1 and [d.embedding[0] for d in many.data] == [2.0, 1.0, 3.0]


@pytest.mark.parametrize("given", [
    [], [[]], [[1], []], [-1], [[2**31]], [2**32 + 5], [True], [[1, False]], [1.5], [1.0], ["a", 1], [1, "a"],
    [[1], "a"], [1, [2]], [[[1]]], 5, {"ids": [1]}, [[1]] * 2049])
async def test_token_ids_outside_bounds_or_mixed_are_a_400_in_openais_shape(client, scripted, given):
    """Ids are ints within llama.cpp's int32 token (llama-server read 2**32 + 5 as token 5, and answered a float or a
    bool with a 500); at most 2048 inputs, none empty; one kind of input a request."""
    resp = await client.post("/v1/embeddings", json={"model": "tiny", "input": given})
    error = (await resp.json())["error"]
    assert resp.status == 400 and scripted.requests == []
    assert error.keys() == {"message", "type", "param", "code"} and isinstance(error["message"], str)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "input", None)


WEATHER_FN = {"name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


async def test_the_legacy_functions_form_is_answered_in_it(base_url, scripted):
    """`functions` and `function_call` (before tools; still in OpenAI's API) are offered as tools, one call a turn,
    and the call comes back as `function_call` with finish_reason "function_call"; before, both were dropped and the
    model answered in prose. The legacy history (an assistant's function_call, a `function` answer) reads too."""
    scripted.script.tool_calls = [ToolCall(name="get_weather", arguments={"city": "Paris"}, id="call_1")]
    sdk = _client(base_url)
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "function_call": {"name": "get_weather",
                                                                        "arguments": '{"city": "Rome"}'}},
               {"role": "function", "name": "get_weather", "content": "sunny"},
               {"role": "user", "content": "And Paris?"}]
    answer = await sdk.chat.completions.create(model="tiny", messages=history, functions=[WEATHER_FN],
                                               function_call={"name": "get_weather"})
    choice = answer.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert (choice.message.function_call.name, orjson.loads(choice.message.function_call.arguments)) == (
        "get_weather", {"city": "Paris"})
    req = scripted.requests[0]
    assert [t.name for t in req.tools] == ["get_weather"] and req.parallel_tool_calls is False
    assert req.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert [(m.role, m.content, [c.arguments for c in m.tool_calls], m.tool_name) for m in req.messages[1:3]] == [
        ("assistant", "", [{"city": "Rome"}], ""), ("tool", "sunny", [], "get_weather")]
    stream = await sdk.chat.completions.create(model="tiny", messages=history[:1], functions=[WEATHER_FN],
                                               stream=True)
    chunks = [c async for c in stream]
    calls = [c.choices[0].delta.function_call for c in chunks if c.choices and c.choices[0].delta.function_call]
    assert [(f.name, orjson.loads(f.arguments)) for f in calls] == [("get_weather", {"city": "Paris"})]
    assert chunks[-1].choices[0].finish_reason == "function_call"
    with pytest.raises(openai.BadRequestError) as e:
        await sdk.chat.completions.create(model="tiny", messages=history[:1], functions=[WEATHER_FN],
                                          function_call="always")
    assert e.value.param == "function_call"
    with pytest.raises(openai.BadRequestError) as e:  # it named `tool_choice`, a field the client never sent
        await sdk.chat.completions.create(model="tiny", messages=history[:1], functions=[WEATHER_FN],
                                          function_call={"name": "get_time"})
    assert e.value.param == "function_call" and "no function named 'get_time'" in e.value.message
    plain = await sdk.chat.completions.create(model="tiny", messages=history[:1], extra_body={"functions": None})
    assert plain.choices[0].finish_reason == "tool_calls" and scripted.requests[-1].tools == []  # was a 500


@pytest.mark.parametrize("tools", [None, []])
async def test_functions_beside_a_null_or_empty_tools_are_offered(client, scripted, tools):
    """A client that writes every field sends `tools: null` beside its `functions`: they were dropped, and the model
    was asked without them."""
    scripted.script.tool_calls = [ToolCall(name="get_weather", arguments={"city": "Paris"}, id="call_1")]
    resp = await client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "Weather?"}], "functions": [WEATHER_FN],
        "function_call": "auto", "tools": tools, "tool_choice": None})
    choice = (await resp.json())["choices"][0]
    assert [t.name for t in scripted.requests[0].tools] == ["get_weather"]
    assert choice["finish_reason"] == "function_call" and choice["message"]["function_call"]["name"] == "get_weather"


async def test_an_assistants_refusal_in_the_history_reads_as_what_it_said(client, scripted):
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "refusal",
                                                                                     "refusal": "I can't."}]},
                {"role": "user", "content": "y"}]
    assert (await client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})).status == 200
    assert scripted.requests[0].messages[1].content == "I can't."


async def test_an_allowed_tools_choice_offers_only_the_tools_it_names(base_url, scripted):
    """OpenAI's `{"type": "allowed_tools", ...}` tool_choice, which the SDK types: it was a 400."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in "fgh"]
    sdk = _client(base_url)
    for mode, choice in (("required", "required"), ("auto", None)):
        allowed = {"mode": mode, "tools": [{"type": "function", "function": {"name": n}} for n in "fh"]}
        await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], tools=tools,
                                          tool_choice={"type": "allowed_tools", "allowed_tools": allowed})
        req = scripted.requests.pop()
        assert ([t.name for t in req.tools], req.tool_choice) == (["f", "h"], choice)
    with pytest.raises(openai.BadRequestError) as e:
        await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], tools=tools,
                                          tool_choice={"type": "allowed_tools", "allowed_tools": {
                                              "mode": "required", "tools": [{"type": "function",
                                                                             "function": {"name": "z"}}]}})
    assert e.value.param == "tool_choice" and "'z' is not among the tools" in e.value.message


@pytest.mark.parametrize("body, fragment, param", [
    ({"model": "tiny"}, "messages is required", "messages"),
    ({"model": "tiny", "messages": []}, "must not be empty", "messages"),
    ({"messages": [{"role": "user", "content": "x"}]}, "model is required", "model"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}, "max_tokens",
     "max_tokens"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 99}, "n must be", "n"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "at least 1", "max_tokens"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0, "max_tokens": 9},
     "at least 1", "max_completion_tokens"),  # it fell back to max_tokens
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
     "response_format", "response_format"),
    ({"model": "tiny", "messages": [{"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, "not valid JSON",
     "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}},
     "only allowed when 'stream' is enabled", "stream_options"),
    # a string read as a flag: "false" asked for the usage chunk, and a string as the object was passed over
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True,
      "stream_options": {"include_usage": "false"}}, "must be a boolean", "stream_options.include_usage"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True, "stream_options": "usage"},
     "stream_options must be an object", "stream_options"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": 2.5}, "temperature",
     "temperature"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "modalities": ["text", "audio"],
      "audio": {"voice": "alloy", "format": "wav"}}, "audio output is not supported", "modalities"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "audio": {"voice": "alloy"}},
     "audio output", "modalities"),
    ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "Invalid value: 'wizard'", "messages"),
    # a message's own field by its path, as OpenAI names it: `role`, `tool_call_id` named no field of the request
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}, {"content": "y"}]},
     "messages[1].role is required", "messages[1].role"),
    ({"model": "tiny", "messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]},
     "messages[0].tool_call_id must be a string", "messages[0].tool_call_id"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
     "no tools are given", "tool_choice"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tool_choice": {
        "type": "function", "function": {"name": "g"}}, "tools": [{"type": "function", "function": {"name": "f"}}]},
     "'g' is not among the tools", "tool_choice"),
    ({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "https://example.com/cat.png"}}]}]}, "only base64 data URLs", "messages"),
    # a null or a number as a part's text reached the model as the word "None" or the number's digits
    ({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
     "text part's text must be a string, got null", "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]},
     "text part's text must be a string, got int", "messages"),
    ({"model": "tiny", "messages": [{"role": "assistant", "content": [{"type": "refusal", "refusal": None}]}]},
     "refusal part's refusal must be a string", "messages"),
])
async def test_bad_input_gets_openai_error(client, scripted, body, fragment, param):
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert fragment in err["message"] and err["type"] == "invalid_request_error" and err["param"] == param
    assert scripted.requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_web_search_options_are_named_as_ignored(client, scripted, stream):
    """Chat's hosted web search (`web_search_options`, OpenAI's search models) runs on no backend here: the answer
    comes from the model alone, so the header says so, as it says of the Responses API's `web_search` tool (it went
    without a word)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": stream,
            "web_search_options": {"search_context_size": "low"}}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200 and resp.headers["X-Velo-Tools-Ignored"] == "web_search"
    await resp.read()
    resp = await client.post("/v1/chat/completions", json={**body, "web_search_options": None})
    assert resp.status == 200 and "X-Velo-Tools-Ignored" not in resp.headers
    resp = await client.post("/v1/chat/completions", json={**body, "web_search_options": "on"})
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["param"] == "web_search_options"


async def test_developer_is_the_system_prompt_and_function_a_tool_answer(client, scripted):
    """`developer` (o1 and later, what new SDK code sends) reaches the template as the system prompt it is, as the
    Responses API has it; the legacy `function` role is a tool's answer under its `name`."""
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": [
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "x", "name": "alice"},
        {"role": "function", "name": "lookup", "content": "42"}]})
    assert resp.status == 200
    assert [(m.role, m.content, m.tool_name) for m in scripted.requests[0].messages] == [
        ("system", "Be brief.", ""), ("user", "x", ""), ("tool", "42", "lookup")]


async def test_openai_client_sees_typed_errors(base_url, scripted: ScriptedBackend):
    c = _client(base_url)
    with pytest.raises(openai.BadRequestError):
        await c.chat.completions.create(model="tiny", messages=[])
    scripted.script.fail_after = 0
    with pytest.raises(openai.APIStatusError) as info:
        await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502


async def test_oversized_body_is_413_in_openai_dialect(client):
    resp = await client.post("/v1/chat/completions", data=b'{"model": "' + b"x" * 70_000 + b'"}')
    assert resp.status == 413 and (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_mid_stream_failure_sends_error_event(client, scripted: ScriptedBackend):
    scripted.script.fail_after = 1
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "stream": True,
                                                          "messages": [{"role": "user", "content": "x"}]})
    events = [e for e in (await resp.text()).split("\n\n") if e]
    assert orjson.loads(events[-1][len("data: "):])["error"]["message"] == "scripted backend broke mid-stream"


async def test_ollama_options_ride_in_an_options_object(client, scripted):
    """OpenAI SDK users reach Ollama-only knobs through extra_body={"options": {...}}; OpenAI fields win."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2,
            "options": {"num_ctx": 4096, "mirostat": 2, "temperature": 0.9}}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200, await resp.text()
    opts = scripted.requests[-1].options
    assert (opts.num_ctx, opts.extra.get("mirostat"), opts.temperature) == (4096, 2, 0.2)


async def test_a_zero_beside_an_options_object_stays_zero(client, scripted):
    """`temperature: 0` and `seed: 0` are set, not unset (`0 == False` in Python let the `options` object's value or
    the default replace them: a greedy request came back sampled, and uncached)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "seed": 0,
            "presence_penalty": 0, "options": {"num_ctx": 4096, "temperature": 0.9, "seed": 7}}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200, await resp.text()
    opts = scripted.requests[-1].options
    assert (opts.temperature, opts.seed, opts.presence_penalty, opts.num_ctx) == (0.0, 0, 0.0, 4096)


async def test_ollama_options_at_the_top_level_are_read_as_open_webui_sends_them(client, scripted):
    """Open WebUI's OpenAI connections put a model's advanced parameters at the top level (utils/payload.py
    apply_model_params_to_body_openai); Ollama's names the OpenAI API lacks were dropped. An `options` object's
    come first; other unknown fields are still not options."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "repeat_penalty": 1.2,
            "repeat_last_n": 32, "typical_p": 0.7, "num_ctx": 2048, "mirostat": 2, "mirostat_tau": 4.0,
            "user": "u1", "options": {"num_ctx": 4096}}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 200, await resp.text()
    opts = scripted.requests[-1].options
    assert (opts.repeat_penalty, opts.repeat_last_n, opts.typical_p, opts.num_ctx) == (1.2, 32, 0.7, 4096)
    assert opts.extra == {"mirostat": 2, "mirostat_tau": 4.0}


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize("vendor", [{"json_schema": SCHEMA}, {"guided_json": SCHEMA},
                                    {"guided_json": orjson.dumps(SCHEMA).decode()},
                                    {"structured_outputs": {"json": SCHEMA}}])
async def test_a_vendors_json_schema_field_constrains_the_answer(client, scripted, vendor):
    """llama-server's and SGLang's `json_schema`, vLLM's `guided_json` and `structured_outputs.json` (extra_body):
    the schema every backend enforces, as `response_format` (they were dropped: an unconstrained answer)."""
    scripted.script.pieces = ['{"a": ', '1}']
    resp = await client.post("/v1/chat/completions", json={"model": "m", **vendor,
                                                          "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 200, await resp.text()
    assert scripted.requests[-1].format == SCHEMA


@pytest.mark.parametrize("vendor, param", [({"guided_choice": ["yes", "no"]}, "guided_choice"),
                                           ({"grammar": 'root ::= "a"'}, "grammar"),
                                           ({"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex"),
                                           ({"json_schema": SCHEMA, "guided_json": SCHEMA}, "json_schema"),
                                           ({"json_schema": SCHEMA, "response_format": {"type": "json_object"}},
                                            "response_format"),
                                           ({"json_schema": "not json"}, "json_schema")])
async def test_a_constraint_velo_cannot_enforce_is_a_400_naming_it(client, scripted, vendor, param):
    resp = await client.post("/v1/chat/completions", json={"model": "m", **vendor,
                                                          "messages": [{"role": "user", "content": "hi"}]})
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["param"] == param and scripted.requests == []


def test_llama_servers_own_samplers_at_the_top_level_reach_it():
    """llama-server's users send its samplers in `extra_body` (`dry_multiplier`, `xtc_probability`, ...): they go
    on in `extra`, which the llama-server adapter writes into its body (they were dropped)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "dry_multiplier": 0.8,
            "xtc_probability": 0.5, "samplers": ["top_k", "dry"], "metadata": {"a": "b"}}
    req = openai_dialect.parse_chat(body)
    assert req.options.extra == {"dry_multiplier": 0.8, "xtc_probability": 0.5, "samplers": ["top_k", "dry"]}
    sent = LlamaCppBackend(BackendConfig(name="l", kind="llamacpp", urls=["http://x"])).chat_body(req)
    assert (sent["dry_multiplier"], sent["xtc_probability"], sent["samplers"]) == (0.8, 0.5, ["top_k", "dry"])
    assert "metadata" not in sent


def test_streamed_tool_calls_keep_counting_indexes_across_chunks():
    """Clients merge tool-call deltas by index, so a second call in a later chunk must not reuse index 0."""
    from proxy.dialects import openai as dialect
    ids = dialect.ChatIds()
    first = dialect.chat_chunk(ids, "m", 0, Chunk(tool_calls=[ToolCall(name="a", arguments={})]))
    second = dialect.chat_chunk(ids, "m", 0, Chunk(tool_calls=[ToolCall(name="b", arguments={})]), calls_sent=1)
    indexes = [tc["index"] for obj in (first, second) for tc in obj["choices"][0]["delta"]["tool_calls"]]
    assert indexes == [0, 1]


@pytest.mark.parametrize("effort, think", [("high", "high"), ("low", "low"), ("minimal", False), ("none", False),
                                           ("xhigh", "high"), ("max", "high")])  # the SDK's levels above "high"
async def test_reasoning_effort_is_the_think_switch(client, scripted: ScriptedBackend, effort, think):
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "reasoning_effort": effort,
                                                          "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 200 and scripted.requests[0].think == think


@pytest.mark.parametrize("extra, think", [({"chat_template_kwargs": {"enable_thinking": False}}, False),
                                          ({"chat_template_kwargs": {"enable_thinking": True}}, None),
                                          ({"chat_template_kwargs": {"enable_thinking": False},
                                            "reasoning_effort": "low"}, "low")])
async def test_chat_template_kwargs_can_turn_thinking_off(client, scripted: ScriptedBackend, extra, think):
    """vLLM's, SGLang's and llama-server's way to turn a Qwen3 model's thinking off (`extra_body`); `true` leaves the
    model's default (a template without the switch ignores it there), and `reasoning_effort` comes first."""
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", **extra,
                                                          "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 200 and scripted.requests[0].think == think


async def test_chat_template_kwargs_go_on_whole(client, scripted: ScriptedBackend):
    resp = await client.post("/v1/chat/completions", json={
        "model": "tiny", "chat_template_kwargs": {"thinking": True, "enable_thinking": True},
        "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 200 and scripted.requests[0].template_kwargs == {"thinking": True, "enable_thinking": True}
    own = await client.post("/v1/chat/completions", json={
        "model": "tiny", "chat_template_kwargs": {"add_generation_prompt": False},
        "messages": [{"role": "user", "content": "hi"}]})
    assert own.status == 400 and (await own.json())["error"]["param"] == "chat_template_kwargs"


async def test_a_bad_reasoning_effort_is_a_400(client):
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "reasoning_effort": "extreme",
                                                          "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 400 and (await resp.json())["error"]["param"] == "reasoning_effort"


async def test_completions_logprobs_come_in_the_completions_shape(client):
    body = {"model": "tiny", "prompt": "Say", "logprobs": 2}
    choice = (await (await client.post("/v1/completions", json=body)).json())["choices"][0]
    assert choice["logprobs"] == {"tokens": ["Hel", "lo", " world"], "token_logprobs": [-0.5] * 3,
                                  "top_logprobs": [{"Hel": -0.5, " x": -2.0}, {"lo": -0.5, " x": -2.0},
                                                   {" world": -0.5, " x": -2.0}],
                                  "text_offset": [0, 3, 5]}
    resp = await client.post("/v1/completions", json={**body, "stream": True})
    events = [orjson.loads(e[6:]) for e in (await resp.text()).split("\n\n") if e.startswith("data: {")]
    offsets = [o for e in events if e["choices"][0]["logprobs"] for o in e["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 3, 5]


@pytest.mark.parametrize("body, param", [
    ({"prompt": "Say", "logprobs": 1, "echo": True}, "echo"),  # lm-eval's loglikelihood: it scores the prompt
    ({"prompt": "Say", "logprobs": 6}, "logprobs"), ({"prompt": "Say", "logprobs": -1}, "logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
])
async def test_logprob_counts_outside_openais_bounds_are_a_400(client, scripted, body, param):
    """Before: a negative count made the engine fail with a 502, 30 alternatives were given, top_logprobs without
    logprobs gave logprobs anyway, and echo with logprobs scored only the answer, so an evaluation summed nothing."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    resp = await client.post(path, json={"model": "tiny", **body})
    assert resp.status == 400 and (await resp.json())["error"]["param"] == param and scripted.requests == []


async def test_completions_stream_options_without_stream_is_a_400(client, scripted):
    resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x",
                                                      "stream_options": {"include_usage": True}})
    assert resp.status == 400 and (await resp.json())["error"]["param"] == "stream_options"
    assert scripted.requests == []



def test_a_token_that_is_part_of_a_character_gives_its_own_bytes():
    """Each part of a character split across tokens reads U+FFFD; its `bytes` were the replacement character's
    (EF BF BD), so a client joining them got three of those, not the character."""
    first = TokenLogprob("\ufffd", -0.1, [TokenLogprob("\ufffd", -0.1, raw=b"\xe6\x97"), TokenLogprob("x", -2.0)],
                         raw=b"\xe6\x97")
    out = openai_dialect.token_logprobs([first, TokenLogprob("\ufffd", -0.2, raw=b"\xa5")])
    assert bytes(b for entry in out for b in entry["bytes"]).decode() == "日"
    assert [t["bytes"] for t in out[0]["top_logprobs"]] == [[0xE6, 0x97], [ord("x")]]


async def test_a_schema_only_llguidance_cannot_compile_is_left_to_the_backend(client, scripted):
    """A look-around `pattern` or a remote `$ref` is no reason for a 400 from every backend: llama-server or vLLM
    may take it."""
    for schema in ({"type": "string", "pattern": "^(?=a)ab$"}, {"$ref": "https://example.com/s.json"}):
        await client.post("/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                             "format": schema, "stream": False})
    assert [r.format for r in scripted.requests] == [{"type": "string", "pattern": "^(?=a)ab$"},
                                                      {"$ref": "https://example.com/s.json"}]


async def test_a_schema_no_output_can_match_does_not_wait_for_a_busy_backends_slot():
    """Checked where the backend was called, after its queue: behind a long answer it waited for a slot first."""
    import time

    from tests.scripted import Script
    busy = ScriptedBackend(script=Script(delay=0.5))
    busy.config.max_concurrency = 1
    async with TestClient(TestServer(make_app(Config(cache=CacheConfig(enabled=False)), {"s": busy}))) as c:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
        long = asyncio.create_task(c.post("/v1/chat/completions", json={**chat, "temperature": 0.7}))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        resp = await c.post("/v1/chat/completions", json={**chat, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "minLength": 3,
                                                                          "maxLength": 1}}}})
        assert resp.status == 400 and time.monotonic() - started < 0.5
        assert (await long).status == 200
