"""The ollama adapter against `OllamaDouble`, the protocol double of Ollama's documented API (docs/api.md of
ollama/ollama; see tests/fakes.py for which section each shape comes from). Ollama itself cannot run here."""
import asyncio
from dataclasses import replace

import pytest

from adapters.base import BackendConfig
from adapters.errors import BackendError, BackendTimeout, BackendUnavailable, ModelNotFound
from adapters.ollama import OllamaBackend
from adapters.protocol import (ChatRequest, CompletionRequest, EmbedRequest, Message, SamplingOptions, Tool,
                               ToolCall, aggregate)

MODEL = "smollm2:135m"


@pytest.fixture
async def backend(ollama_double):
    b = OllamaBackend(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url]))
    yield b
    await b.close()


def chat(stream=True, **kw) -> ChatRequest:
    return ChatRequest(model=MODEL, messages=[Message(role="user", content="Hi there")], stream=stream, **kw)


async def collect(stream):
    return [c async for c in stream]


async def test_chat_stream_yields_tokens_then_a_final_chunk_with_usage(backend, ollama_double):
    ollama_double.script.reply = "Hello big world"
    chunks = await collect(backend.chat(chat()))
    assert [c.text for c in chunks] == ["Hello", " big", " world", ""]
    final = chunks[-1]
    assert final.finish_reason == "stop"
    assert final.usage.completion_tokens == 3 and final.usage.prompt_tokens == 2
    assert final.usage.eval_ns > 0
    assert ollama_double.last("/api/chat")["stream"] is True


async def test_chat_non_stream_is_streamed_from_ollama_so_a_hung_one_is_found_early(backend, ollama_double):
    """One answer for the client, a stream from Ollama: `first_token_timeout` bounds the wait, not
    `total_timeout` (seen: 600 s for a backend that accepted and never answered)."""
    ollama_double.script.reply = "All at once"
    whole = aggregate(await collect(backend.chat(chat(stream=False))))
    assert whole.text == "All at once" and whole.finish_reason == "stop"
    assert ollama_double.last("/api/chat")["stream"] is True
    ollama_double.script.token_delay = 1.0
    backend.config.first_token_timeout = 0.2
    with pytest.raises(BackendTimeout, match="sent no first data within 0.2s"):
        await collect(backend.chat(chat(stream=False)))


async def test_with_always_stream_off_one_answer_is_asked_as_one_and_reads_as_the_stream_does(ollama_double):
    """`always_stream = false`: Ollama gets the client's `stream: false`; text, usage, tool calls (finishing as
    "tool_calls" though Ollama says "stop") and /api/generate's context come out as from the stream."""
    plain = OllamaBackend(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url], always_stream=False))
    ollama_double.script.reply = "All at once"
    whole = aggregate(await collect(plain.chat(chat(stream=False))))
    assert ollama_double.last("/api/chat")["stream"] is False
    assert (whole.text, whole.finish_reason, whole.usage.completion_tokens) == ("All at once", "stop", 3)
    ollama_double.script.reply = ""
    ollama_double.script.tool_calls = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    calls = aggregate(await collect(plain.chat(chat(stream=False, tools=[Tool("get_weather")]))))
    [call] = calls.tool_calls
    assert (call.name, call.arguments, call.id.startswith("call_")) == ("get_weather", {"city": "Paris"}, True)
    assert calls.finish_reason == "tool_calls"
    ollama_double.script.tool_calls = []
    ollama_double.script.reply = "Hi"
    first = aggregate(await collect(plain.complete(CompletionRequest(model=MODEL, prompt="Hi", stream=False))))
    assert ollama_double.last("/api/generate")["stream"] is False and first.text == "Hi" and first.context
    await plain.close()


async def test_sampling_options_map_to_ollama_options(backend, ollama_double):
    opts = SamplingOptions(max_tokens=2, temperature=0.1, top_k=7, top_p=0.8, min_p=0.05, typical_p=0.7,
                           seed=42, stop=["\n"], repeat_penalty=1.1, repeat_last_n=33, num_ctx=1024,
                           presence_penalty=0.5, frequency_penalty=0.25, extra={"mirostat": 1, "num_keep": 5})
    chunks = await collect(backend.chat(chat(options=opts, keep_alive="5m", format="json", think=True)))
    sent = ollama_double.last("/api/chat")
    assert sent["options"] == {"num_predict": 2, "temperature": 0.1, "top_k": 7, "top_p": 0.8, "min_p": 0.05,
                               "typical_p": 0.7, "seed": 42, "stop": ["\n"], "repeat_penalty": 1.1,
                               "repeat_last_n": 33, "num_ctx": 1024, "presence_penalty": 0.5,
                               "frequency_penalty": 0.25, "mirostat": 1, "num_keep": 5}
    assert (sent["keep_alive"], sent["format"], sent["think"]) == ("5m", "json", True)
    assert aggregate(chunks).finish_reason == "length"  # the double honoured num_predict


async def test_truncate_and_shift_reach_ollama_as_sent(backend, ollama_double):
    """Ollama fits the context itself: the client's `truncate` and `shift` go to it untouched, and are left out
    where the client left them out (Ollama's defaults, both true, then hold)."""
    await collect(backend.chat(chat(truncate=False, shift=False)))
    sent = ollama_double.last("/api/chat")
    assert (sent["truncate"], sent["shift"]) == (False, False)
    await collect(backend.complete(CompletionRequest(model=MODEL, prompt="Hi", truncate=True)))
    sent = ollama_double.last("/api/generate")
    assert sent["truncate"] is True and "shift" not in sent
    await collect(backend.chat(chat()))
    assert not {"truncate", "shift"} & ollama_double.last("/api/chat").keys()


async def test_json_schema_format_and_thinking(backend, ollama_double):
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}}
    ollama_double.script.thinking = "Let me think."
    out = aggregate(await collect(backend.chat(chat(format=schema, think=True))))
    assert ollama_double.last("/api/chat")["format"] == schema
    assert out.thinking == "Let me think."


async def test_tool_calls_both_ways(backend, ollama_double):
    ollama_double.script.reply = ""
    ollama_double.script.tool_calls = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    history = [Message(role="user", content="Weather?"),
               Message(role="assistant", tool_calls=[ToolCall(name="get_weather", arguments={"city": "Rome"})]),
               Message(role="tool", content="sunny", tool_name="get_weather")]
    tool = Tool(name="get_weather", description="Weather for a city",
                parameters={"type": "object", "properties": {"city": {"type": "string"}}})
    for stream in (True, False):
        req = ChatRequest(model=MODEL, messages=history, tools=[tool], stream=stream)
        out = aggregate(await collect(backend.chat(req)))
        [call] = out.tool_calls  # with the id Ollama gave it
        assert (call.name, call.arguments, call.id[:5], len(call.id)) == ("get_weather", {"city": "Paris"}, "call_", 13)
        assert out.finish_reason == "tool_calls"
    sent = ollama_double.last("/api/chat")
    assert sent["tools"][0] == {"type": "function", "function": {"name": "get_weather",
                                                                 "description": "Weather for a city",
                                                                 "parameters": tool.parameters}}
    assert sent["messages"][1]["tool_calls"] == [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]
    assert sent["messages"][2] == {"role": "tool", "content": "sunny", "tool_name": "get_weather"}


async def test_generate_raw_suffix_and_context_round_trip(backend, ollama_double):
    """A raw fill-in-the-middle (OpenAI's /v1/completions with `suffix`) goes without `raw`: Ollama builds the middle's
    prompt only in the model's template, which raw mode skips (server/routes.go GenerateHandler), so the suffix was
    dropped and the prefix continued as if the file ended there. Its answer still has no context, as a raw one."""
    ollama_double.script.reply = "return a + b"
    fim = CompletionRequest(model=MODEL, prompt="def add(a, b):\n    ", suffix="\n", raw=True,
                            options=SamplingOptions(max_tokens=16, stop=["\n\n"]))
    for stream in (True, False):
        out = aggregate(await collect(backend.complete(replace(fim, stream=stream))))
        assert out.text == "return a + b" and out.context is None
        sent = ollama_double.last("/api/generate")
        assert ("raw" in sent, sent["suffix"], sent["options"]) == (False, "\n", {"num_predict": 16, "stop": ["\n\n"]})
    await collect(backend.complete(replace(fim, suffix="")))  # an empty suffix asks for no middle: raw it stays
    assert ollama_double.last("/api/generate")["raw"] is True

    first = aggregate(await collect(backend.complete(CompletionRequest(model=MODEL, prompt="Hi", system="Be brief"))))
    assert first.context
    await collect(backend.complete(CompletionRequest(model=MODEL, prompt="More", context=first.context)))
    sent = ollama_double.last("/api/generate")
    assert sent["context"] == first.context and "raw" not in sent
    assert ollama_double.requests[-2].body["system"] == "Be brief"


async def test_embed(backend, ollama_double):
    result = await backend.embed(EmbedRequest(model=MODEL, inputs=["a b", "c"], dimensions=4, keep_alive=0))
    assert len(result.embeddings) == 2 and len(result.embeddings[0]) == 4
    assert result.embeddings[0] != result.embeddings[1]
    assert result.prompt_tokens == 3
    assert ollama_double.last("/api/embed") == {"model": MODEL, "input": ["a b", "c"], "truncate": True,
                                                 "dimensions": 4, "keep_alive": 0}


async def test_tags_show_ps(backend, ollama_double):
    models = await backend.list_models()
    assert [m.name for m in models] == ["smollm2:135m", "all-minilm:latest"]
    assert models[0].backend == "ollama" and models[0].quantization_level == "Q4_1" and models[0].size > 0
    info = await backend.show(MODEL)
    assert info.context_length == 8192 and "tools" in info.capabilities and "insert" in info.capabilities
    assert info.model_info["general.architecture"] == "llama" and "<|im_start|>" in info.template
    assert info.family == "llama" and "stop" in info.parameters
    running = await backend.running()
    assert [r.name for r in running] == [m.name for m in models]
    assert running[0].expires_at.startswith("2099") and running[0].info.context_length == 8192


async def test_manage_passes_status_streams_through(backend, ollama_double):
    statuses = [s async for s in backend.manage("POST", "/api/pull", {"model": "qwen:0.5b"})]
    assert statuses[0] == {"status": "pulling manifest"} and statuses[-1] == {"status": "success"}
    assert any("completed" in s for s in statuses)
    assert [s async for s in backend.manage("POST", "/api/copy", {"source": "qwen:0.5b",
                                                                  "destination": "q2"})] == []
    assert [s async for s in backend.manage("DELETE", "/api/delete", {"model": "q2"})] == []
    assert "q2" not in ollama_double.models and "qwen:0.5b" in ollama_double.models
    with pytest.raises(ModelNotFound):
        [s async for s in backend.manage("DELETE", "/api/delete", {"model": "q2"})]


async def test_unknown_model_is_model_not_found(backend):
    with pytest.raises(ModelNotFound) as e:
        await collect(backend.chat(ChatRequest(model="nope", messages=[Message(role="user", content="x")])))
    assert e.value.status == 404 and "nope" in e.value.message
    with pytest.raises(ModelNotFound):
        await backend.show("nope")


async def test_upstream_500_is_backend_error(backend, ollama_double):
    ollama_double.script.fail_status, ollama_double.script.fail_message = 500, "CUDA out of memory"
    with pytest.raises(BackendError) as e:
        await collect(backend.chat(chat()))
    assert e.value.status == 502 and "CUDA out of memory" in e.value.message


async def test_stream_cut_midway_raises_promptly(backend, ollama_double):
    ollama_double.script.cut_after = 2
    got = []
    with pytest.raises(BackendError) as e:
        async for chunk in backend.chat(chat()):
            got.append(chunk)
    assert len(got) == 2 and e.value.status == 502


async def test_slow_backend_times_out(ollama_double):
    ollama_double.script.token_delay = 0.5
    b = OllamaBackend(BackendConfig(name="slow", kind="ollama", urls=[ollama_double.url], first_token_timeout=0.1))
    with pytest.raises(BackendTimeout) as e:
        await collect(b.chat(chat()))
    await b.close()
    assert e.value.status == 504 and "'slow'" in e.value.message


async def test_idle_gap_between_chunks_times_out(ollama_double):
    ollama_double.script.token_delay = 0.3  # within the first-token budget, over the idle one
    b = OllamaBackend(BackendConfig(name="o", kind="ollama", urls=[ollama_double.url], first_token_timeout=1,
                                    idle_timeout=0.1))
    got = []
    with pytest.raises(BackendTimeout) as e:
        async for chunk in b.chat(chat()):
            got.append(chunk)
    await b.close()
    assert len(got) == 1 and "between chunks" in e.value.message


async def test_connection_refused_is_backend_unavailable(dead_port):
    url = f"http://127.0.0.1:{dead_port}"
    b = OllamaBackend(BackendConfig(name="down", kind="ollama", urls=[url]))
    with pytest.raises(BackendUnavailable) as e:
        await b.list_models()
    await b.close()
    assert e.value.status == 503 and "'down'" in e.value.message and url in e.value.message
    assert not await b.health()


async def test_closing_the_stream_early_cancels_the_upstream(backend, ollama_double):
    ollama_double.script.reply = " ".join(["word"] * 50)
    ollama_double.script.token_delay = 0.02
    stream = backend.chat(chat())
    assert (await stream.__anext__()).text == "word"
    await stream.aclose()  # the client went away
    for _ in range(50):
        if ollama_double.disconnects:
            break
        await asyncio.sleep(0.02)
    assert ollama_double.disconnects == 1
    assert await backend.health()  # the pool still works after the aborted request


async def test_openai_style_tool_answer_gets_its_tool_name(backend, ollama_double):
    """An OpenAI client answers a call by id only; Ollama wants the tool's name, and takes the ids as well."""
    history = [Message(role="user", content="Weather?"),
               Message(role="assistant", tool_calls=[ToolCall(name="get_weather", arguments={"city": "Rome"},
                                                              id="call_7")]),
               Message(role="tool", content="sunny", tool_call_id="call_7")]
    await collect(backend.chat(ChatRequest(model=MODEL, messages=history)))
    sent = ollama_double.last("/api/chat")["messages"]
    assert sent[1]["tool_calls"] == [{"id": "call_7", "function": {"name": "get_weather",
                                                                   "arguments": {"city": "Rome"}}}]
    assert sent[2] == {"role": "tool", "content": "sunny", "tool_name": "get_weather", "tool_call_id": "call_7"}


def test_logprobs_keep_the_bytes_ollama_gives_a_token_that_is_part_of_a_character():
    """server/logprob.go writes a token's text and its bytes: for part of a character the text is U+FFFD, and
    only the bytes say which part (they went out again as EF BF BD)."""
    from adapters.ollama import logprobs_from_wire
    [part] = logprobs_from_wire([{"token": "\ufffd", "logprob": -0.5, "bytes": [230, 151],
                                  "top_logprobs": [{"token": "\ufffd", "logprob": -0.5, "bytes": [230, 151]},
                                                   {"token": "a", "logprob": -3.0, "bytes": [97]}]}])
    assert (part.utf8, [t.utf8 for t in part.top]) == ([230, 151], [[230, 151], [97]])
    assert part.top[1].raw is None  # a whole character's bytes are its text's: not kept twice


def test_odd_fields_of_an_answer_are_read_where_a_wrong_type_is_a_502_not_a_500_later():
    """A date that is not a string made /api/tags and /v1/models 500s (read later), null parameters /api/show's, a
    load answer that is not an object a bare /api/generate's, and a legacy embedding missing /api/embeddings'."""
    from adapters.fields import count
    from adapters.ollama import _embedding, model_info_from_wire
    info = model_info_from_wire("m", "b", {"modified_at": 5, "parameters": None, "capabilities": ["tools", 1],
                                           "size": "big", "context_length": None})
    assert (info.parameters, info.capabilities, info.size, info.context_length) == ("", ["tools"], 0, None)
    assert info.modified_at == model_info_from_wire("m", "b", {}).modified_at  # as for none given
    with pytest.raises(TypeError):
        model_info_from_wire("m", "b", {"digest": 7})  # the call's parse: a 502
    assert count([1], "load_duration") == 0 and count({"load_duration": 12}, "load_duration") == 12
    with pytest.raises(KeyError):
        _embedding({})
    with pytest.raises(TypeError):
        _embedding({"embedding": 5})
    assert _embedding({"embedding": [0.5]}) == [0.5]
