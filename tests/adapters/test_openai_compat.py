"""The openai adapter against `FakeOpenAI` (tests/fakes.py): wire shapes, streamed tool-call assembly, API key,
and every failure mode mapped to its domain error (down, slow, failing, cut mid-stream, closed early)."""
import asyncio

import orjson
import pytest

from adapters.base import BackendConfig
from adapters.errors import (BackendError, BackendTimeout, BackendUnavailable, ModelNotFound, Overloaded,
                             PayloadTooLarge, Unauthorized, VeloError)
from adapters.openai_compat import OpenAIBackend
from adapters.openai_wire import chat_to_wire
from adapters.protocol import (ChatRequest, CompletionRequest, EmbedRequest, Message, SamplingOptions, Tool,
                               ToolCall, aggregate)
from tests.fakes import FakeOpenAI, tokens

MODEL = "fake-gpt"
WEATHER = Tool(name="get_weather", description="Weather for a city",
               parameters={"type": "object", "properties": {"city": {"type": "string"}}})


def config(url: str, **kw) -> BackendConfig:
    return BackendConfig(name="oai", kind="openai", urls=[url], **kw)


@pytest.fixture
async def backend(openai_fake):
    b = OpenAIBackend(config(openai_fake.url))
    yield b
    await b.close()


def chat(stream=True, **kw) -> ChatRequest:
    return ChatRequest(model=MODEL, messages=[Message(role="user", content="Hi there")], stream=stream, **kw)


async def collect(stream):
    return [c async for c in stream]


async def test_chat_stream_text_then_finish_with_usage(backend, openai_fake):
    openai_fake.script.reply = "Hello big world"
    chunks = [c async for c in backend.chat(chat())]  # the role delta, with nothing to send, sends nothing
    assert "".join(c.text for c in chunks) == "Hello big world" and len(chunks) == 4
    assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.completion_tokens == 3
    sent = openai_fake.last("/v1/chat/completions")
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


async def test_sampling_format_and_n_on_the_wire(backend, openai_fake):
    opts = SamplingOptions(max_tokens=2, temperature=0.2, top_p=0.9, top_k=5, min_p=0.1, seed=7, stop=["x"],
                           presence_penalty=0.5, frequency_penalty=0.3)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    out = aggregate(await collect(backend.chat(chat(stream=False, options=opts, format=schema))))
    sent = openai_fake.last("/v1/chat/completions")
    assert {k: sent[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                                 "presence_penalty", "frequency_penalty")} == {
        "max_tokens": 2, "temperature": 0.2, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 7, "stop": ["x"],
        "presence_penalty": 0.5, "frequency_penalty": 0.3}
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    assert out.finish_reason == "length" and out.usage.completion_tokens == 2


@pytest.mark.parametrize("top_p", [0, 0.0])
async def test_a_top_p_of_0_goes_out_as_greedy_decoding(backend, openai_fake, top_p):
    """OpenAI takes top_p 0 (the likeliest token alone), vLLM and SGLang refuse it (top_p must be in (0, 1]): sent
    as it was, an answer OpenAI gives was their 400. Greedy decoding is what it asks for."""
    opts = SamplingOptions(top_p=top_p, temperature=0.7, max_tokens=2)
    out = aggregate(await collect(backend.chat(chat(options=opts))))
    sent = openai_fake.last("/v1/chat/completions")
    assert (sent["temperature"], sent["top_p"], out.finish_reason) == (0, 1, "length")
    await collect(backend.complete(CompletionRequest(model=MODEL, prompt="Hi", raw=True, options=opts)))
    sent = openai_fake.last("/v1/completions")
    assert (sent["temperature"], sent["top_p"]) == (0, 1)
    await collect(backend.chat(chat(options=SamplingOptions(top_p=0.5))))
    assert openai_fake.last("/v1/chat/completions")["top_p"] == 0.5
    # the Ollama dialect's values past vLLM's other bounds, read as llama.cpp (Ollama) reads them, as the engine does
    await collect(backend.chat(chat(options=SamplingOptions(temperature=-1, min_p=2, repeat_penalty=0))))
    sent = openai_fake.last("/v1/chat/completions")
    assert (sent["temperature"], sent["min_p"], sent["repetition_penalty"]) == (0, 0, 1)


@pytest.mark.parametrize("stream", [True, False])
async def test_tool_calls_round_trip(backend, openai_fake, stream):
    openai_fake.script.reply = ""
    openai_fake.script.tool_calls = [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                     {"name": "get_weather", "arguments": {"city": "Oslo"}}]
    history = [Message(role="user", content="Weather?"),
               Message(role="assistant", tool_calls=[ToolCall(name="get_weather", arguments={"city": "Rome"},
                                                              id="call_9")]),
               Message(role="tool", content="sunny", tool_call_id="call_9")]
    req = ChatRequest(model=MODEL, messages=history, tools=[WEATHER], tool_choice="auto", stream=stream)
    out = aggregate(await collect(backend.chat(req)))
    assert [(c.name, c.arguments, c.id) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris"}, "call_0"), ("get_weather", {"city": "Oslo"}, "call_1")]
    assert out.finish_reason == "tool_calls" and out.text == ""
    sent = openai_fake.last("/v1/chat/completions")
    assert sent["tool_choice"] == "auto" and sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["messages"][1]["tool_calls"] == [{"id": "call_9", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city":"Rome"}'}}]
    assert sent["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_9"}


async def test_malformed_tool_arguments_become_text_for_repair(backend, openai_fake):
    openai_fake.script.reply = ""
    openai_fake.script.tool_calls = [{"name": "get_weather", "arguments": '{"city": "Paris"'}]
    out = aggregate(await collect(backend.chat(chat(tools=[WEATHER]))))
    assert out.tool_calls == [] and out.finish_reason == "stop"
    assert out.text == '{"name": "get_weather", "arguments": {"city": "Paris"}'


async def test_completion_raw_and_fim_use_v1_completions_plain_prompt_uses_chat(backend, openai_fake):
    openai_fake.script.reply = "return a + b"
    fim = CompletionRequest(model=MODEL, prompt="def add(a, b):\n    ", suffix="\n", raw=True)
    out = aggregate(await collect(backend.complete(fim)))
    assert out.text == "return a + b" and out.finish_reason == "stop"
    assert openai_fake.last("/v1/completions")["suffix"] == "\n"
    await collect(backend.complete(CompletionRequest(model=MODEL, prompt="Hi", system="Be brief", stream=False)))
    assert openai_fake.last("/v1/chat/completions")["messages"] == [
        {"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]


async def test_embed_and_models(backend, openai_fake):
    result = await backend.embed(EmbedRequest(model=MODEL, inputs=["a b", "c"], dimensions=4))
    assert [len(e) for e in result.embeddings] == [4, 4] and result.embeddings[0] != result.embeddings[1]
    assert result.prompt_tokens == 3
    assert openai_fake.last("/v1/embeddings")["encoding_format"] == "float"
    [listed] = await backend.list_models()
    assert (listed.name, listed.modified_at) == (MODEL, "2023-11-14T22:13:20Z")  # the fake's created: 1700000000
    assert await backend.health()
    with_v1 = OpenAIBackend(config(openai_fake.url + "/v1/"))  # as OpenAI SDK base URLs are written
    assert [m.name for m in await with_v1.list_models()] == [MODEL]
    await with_v1.close()


async def test_api_key_goes_out_as_bearer():
    async with FakeOpenAI(api_key="sk-test") as fake:
        good, bad = OpenAIBackend(config(fake.url, api_key="sk-test")), OpenAIBackend(config(fake.url))
        assert [m.name for m in await good.list_models()] == [MODEL]
        assert fake.requests[-1].headers["Authorization"] == "Bearer sk-test"
        with pytest.raises(VeloError) as e:
            await collect(bad.chat(chat()))
        await good.close()
        await bad.close()
    assert e.value.status == 502 and "Incorrect API key" in e.value.message
    assert not isinstance(e.value, Unauthorized)  # Velo's own client is not the one who is unauthorised


async def test_error_statuses_map_to_domain_errors(backend, openai_fake):
    with pytest.raises(ModelNotFound):
        await collect(backend.chat(ChatRequest(model="nope", messages=[Message(role="user", content="x")])))
    # 413: a proxy in front of the server refused the client's body, passed on as it came (was a 502)
    for status, kind in ((429, Overloaded), (503, BackendUnavailable), (500, BackendError), (413, PayloadTooLarge)):
        openai_fake.script.fail_status, openai_fake.script.fail_message = status, f"boom {status}"
        with pytest.raises(kind) as e:
            await collect(backend.chat(chat()))
        assert e.value.status == (502 if status == 500 else status) and f"boom {status}" in e.value.message


async def test_cut_mid_stream_raises_promptly(backend, openai_fake):
    openai_fake.script.reply = "one two three four"
    openai_fake.script.cut_after = 3  # role chunk + two words, then the connection drops
    got = []
    with pytest.raises(BackendError) as e:
        async with asyncio.timeout(5):
            async for chunk in backend.chat(chat()):
                got += [] if chunk.empty else [chunk.text]
    assert got == ["one", " two"] and e.value.status == 502


async def test_slow_first_token_and_idle_gap_time_out(openai_fake):
    openai_fake.script.token_delay = 0.4
    slow = OpenAIBackend(config(openai_fake.url, first_token_timeout=0.1))
    with pytest.raises(BackendTimeout) as e:
        await collect(slow.chat(chat()))
    assert e.value.status == 504 and "first data" in e.value.message
    openai_fake.script.token_delay = 0.2
    idle = OpenAIBackend(config(openai_fake.url, first_token_timeout=2, idle_timeout=0.05))
    with pytest.raises(BackendTimeout) as e:
        await collect(idle.chat(chat()))
    assert "between chunks" in e.value.message
    total = OpenAIBackend(config(openai_fake.url, first_token_timeout=2, idle_timeout=2, total_timeout=0.5))
    with pytest.raises(BackendTimeout) as e:
        await collect(total.chat(chat()))
    assert e.value.message.endswith("did not send the whole answer within 0.5s")  # not "(0.5s total) within 0.01s"
    for b in (slow, idle, total):
        await b.close()


async def test_down_backend_is_unavailable(dead_port):
    url = f"http://127.0.0.1:{dead_port}"
    b = OpenAIBackend(config(url))
    with pytest.raises(BackendUnavailable) as e:
        await collect(b.chat(chat()))
    assert e.value.status == 503 and url in e.value.message and "not reachable" in e.value.message
    assert not await b.health()
    await b.close()


async def test_closing_the_stream_early_cancels_the_upstream(backend, openai_fake):
    openai_fake.script.reply = " ".join(["word"] * 50)
    openai_fake.script.token_delay = 0.02
    stream = backend.chat(chat())
    assert [(await stream.__anext__()).text for _ in range(2)] == ["word", " word"]
    await stream.aclose()
    for _ in range(50):
        if openai_fake.disconnects:
            break
        await asyncio.sleep(0.02)
    assert openai_fake.disconnects == 1


async def test_ollama_style_history_gets_linked_call_ids(backend, openai_fake):
    """Ollama histories carry no ids; OpenAI servers need each tool answer to name the call it answers."""
    calls = [ToolCall(name="get_weather", arguments={"city": "Rome"}), ToolCall(name="get_time", arguments={})]
    history = [Message(role="user", content="Weather and time?"), Message(role="assistant", tool_calls=calls),
               Message(role="tool", content="12:00", tool_name="get_time"),
               Message(role="tool", content="sunny", tool_name="get_weather")]
    await collect(backend.chat(ChatRequest(model=MODEL, messages=history)))
    sent = openai_fake.last("/v1/chat/completions")["messages"]
    ids = [c["id"] for c in sent[1]["tool_calls"]]
    assert len(set(ids)) == 2
    assert [(m["tool_call_id"], m["name"]) for m in sent[2:]] == [(ids[1], "get_time"), (ids[0], "get_weather")]


def test_a_tool_results_images_follow_it_as_a_user_turn():
    """OpenAI's tool messages take text only (Claude Code's Read of a picture is an image in a tool result)."""
    history = [Message("user", "look"), Message("assistant", tool_calls=[ToolCall("read", {}, "c1")]),
               Message("tool", "cat.png", tool_call_id="c1", images=["iVBORw0KGgo="])]
    sent = chat_to_wire(ChatRequest("m", history))["messages"]
    assert sent[2] == {"role": "tool", "content": "cat.png", "tool_call_id": "c1"}
    assert sent[3]["role"] == "user" and sent[3]["content"][1] == {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def test_an_earlier_turns_reasoning_goes_back_to_the_server():
    """A thinking model's tool loop reads its own reasoning from the step before (Qwen3's template keeps it after
    the last user turn; gpt-oss and MiniMax-M2 rely on it): every dialect carries it in, and it was dropped on the
    OpenAI wire (Ollama's kept it)."""
    history = [Message("user", "weather?"),
               Message("assistant", thinking="ask the tool", tool_calls=[ToolCall("weather", {}, "c1")]),
               Message("tool", "sunny", tool_call_id="c1")]
    sent = chat_to_wire(ChatRequest("m", history))["messages"]
    assert sent[1]["reasoning_content"] == sent[1]["reasoning"] == "ask the tool"
    assert "reasoning" not in sent[0] and "reasoning" not in sent[2]


@pytest.mark.parametrize("think, wire", [
    (True, {"chat_template_kwargs": {"enable_thinking": True}}),
    (False, {"chat_template_kwargs": {"enable_thinking": False}}),
    ("high", {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "high"}),
    (None, {})])
def test_the_think_switch_on_the_openai_wire(think, wire):
    body = chat_to_wire(ChatRequest("m", [Message("user", "hi")], think=think))
    assert {k: body[k] for k in ("chat_template_kwargs", "reasoning_effort") if k in body} == wire


def test_a_clients_template_variables_go_on_under_the_think_switch():
    """vLLM's, SGLang's and llama-server's `chat_template_kwargs` reach them whole; Velo's switch goes over them."""
    req = ChatRequest("m", [Message("user", "hi")], think=False,
                      template_kwargs={"enable_thinking": True, "thinking": True})
    assert chat_to_wire(req)["chat_template_kwargs"] == {"enable_thinking": False, "thinking": True}


@pytest.mark.parametrize("owner, wanted", [
    ("vllm", {"continue_final_message": True, "add_generation_prompt": False}),
    ("sglang", {"continue_final_message": True}), ("fake", {})])
async def test_a_prefilled_turn_is_continued_on_servers_that_said_they_are_vllm_or_sglang(openai_fake, owner,
                                                                                          wanted):
    """Their templates close the prefilled assistant turn and open a new one unless asked to continue it; any
    other server (OpenAI's own refuses unknown fields) gets the chat as it is."""
    openai_fake.owner = owner
    b = OpenAIBackend(config(openai_fake.url))
    try:
        await b.list_models()
        await collect(b.chat(ChatRequest(MODEL, [Message("user", "JSON please"), Message("assistant", "{")])))
        sent = openai_fake.last("/v1/chat/completions")
        assert sent["messages"][-1] == {"role": "assistant", "content": "{"}
        assert {k: sent[k] for k in ("continue_final_message", "add_generation_prompt") if k in sent} == wanted
        await collect(b.chat(chat()))
        assert "continue_final_message" not in openai_fake.last("/v1/chat/completions")
        assert b.refuses_output_past_window == bool(wanted)  # both check prompt + max_tokens against the window
        assert b.forces_tool_choice == bool(wanted)  # and force a required call with guided decoding
    finally:
        await b.close()


@pytest.mark.parametrize("owner", ["vllm", "fake"])
async def test_vllm_counts_a_chat_as_its_template_renders_it(openai_fake, owner):
    """vLLM's /tokenize takes the chat as /v1/chat/completions does (tools, template variables) and says how many
    tokens it renders to; other servers cannot say (None: the proxy estimates)."""
    openai_fake.owner = owner
    b = OpenAIBackend(config(openai_fake.url))
    try:
        await b.list_models()
        req = ChatRequest(MODEL, [Message("user", "How warm is it in Paris")], tools=[WEATHER],
                          template_kwargs={"enable_thinking": False})
        counted = await b.count_tokens(req)
        if owner == "fake":
            assert counted is None and not any(r.path == "/tokenize" for r in openai_fake.requests)
            return
        sent = openai_fake.last("/tokenize")
        assert counted == len(tokens(orjson.dumps(sent["messages"]).decode())) > 0
        assert sent["tools"][0]["function"]["name"] == "get_weather"
        assert sent["chat_template_kwargs"] == {"enable_thinking": False}
        raw = await b.count_tokens(CompletionRequest(model=MODEL, prompt="one two three", raw=True))
        assert raw == 3 and openai_fake.last("/tokenize") == {"model": MODEL, "prompt": "one two three"}
        openai_fake.owner = "fake"  # an older vLLM without /tokenize: the estimate stays
        assert await b.count_tokens(req) is None
    finally:
        await b.close()


async def test_vllm_counts_a_generate_with_its_own_go_template_as_that_template_renders_it(openai_fake):
    """Ollama's per-request `template` renders the prompt `complete` sends raw; the count asked /tokenize for the
    model's chat template instead, another prompt than the one evaluated."""
    openai_fake.owner = "vllm"
    b = OpenAIBackend(config(openai_fake.url))
    try:
        await b.list_models()
        req = CompletionRequest(MODEL, prompt="How warm", system="Be brief.", template="{{ .System }} {{ .Prompt }}")
        await collect(b.complete(req))
        sent = openai_fake.last("/v1/completions")["prompt"]
        assert await b.count_tokens(req) == len(tokens(sent)) and openai_fake.last("/tokenize")["prompt"] == sent
    finally:
        await b.close()


async def test_a_non_streamed_answer_is_streamed_from_the_backend_and_a_hung_one_found_early(backend, openai_fake):
    """One answer for the client, a stream from the backend: `first_token_timeout` bounds the wait for a backend
    that accepts and never answers, not `total_timeout` (600 s by default)."""
    openai_fake.script.reply = "Hello big world"
    assert aggregate(await collect(backend.chat(chat(stream=False)))).text == "Hello big world"
    assert openai_fake.last("/v1/chat/completions")["stream"] is True
    openai_fake.script.token_delay = 1.0
    backend.config.first_token_timeout = backend.http.config.first_token_timeout = 0.2
    with pytest.raises(BackendTimeout, match="sent no first data within 0.2s"):
        await collect(backend.chat(chat(stream=False)))


async def test_with_always_stream_off_one_answer_is_asked_as_one_and_folds_as_the_stream_does(openai_fake):
    """`always_stream = false`: the backend gets the client's `stream: false` (less work for it) and the answer
    comes out as the streamed one would: text, tool calls in order with their ids, finish, usage."""
    plain = OpenAIBackend(config(openai_fake.url, always_stream=False))
    openai_fake.script.reply = "Hello big world"
    whole = aggregate(await collect(plain.chat(chat(stream=False))))
    assert openai_fake.last("/v1/chat/completions")["stream"] is False
    streamed = aggregate(await collect(plain.chat(chat(stream=True))))
    assert openai_fake.last("/v1/chat/completions")["stream"] is True  # a client's stream stays a stream
    assert (whole.text, whole.finish_reason, whole.usage.completion_tokens) == (
        streamed.text, streamed.finish_reason, streamed.usage.completion_tokens) == ("Hello big world", "stop", 3)
    openai_fake.script.reply = ""
    openai_fake.script.tool_calls = [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                     {"name": "get_weather", "arguments": {"city": "Oslo"}}]
    calls = aggregate(await collect(plain.chat(chat(stream=False, tools=[WEATHER]))))
    assert [(c.name, c.arguments, c.id) for c in calls.tool_calls] == [
        ("get_weather", {"city": "Paris"}, "call_0"), ("get_weather", {"city": "Oslo"}, "call_1")]
    assert calls.finish_reason == "tool_calls"
    openai_fake.script.tool_calls = []
    openai_fake.script.reply = "return a + b"
    fim = CompletionRequest(model=MODEL, prompt="def add(a, b):\n    ", suffix="\n", raw=True, stream=False)
    assert aggregate(await collect(plain.complete(fim))).text == "return a + b"
    assert openai_fake.last("/v1/completions")["stream"] is False
    await plain.close()


async def test_with_always_stream_off_a_slow_answer_waits_for_total_timeout_not_the_first_token(openai_fake):
    """The trade the setting names: no first byte to time, so a backend that takes longer than
    `first_token_timeout` for its whole answer is still waited for, up to `total_timeout`."""
    openai_fake.script.reply = "Hello big world"
    openai_fake.script.token_delay = 0.1
    plain = OpenAIBackend(config(openai_fake.url, always_stream=False, first_token_timeout=0.05, total_timeout=5))
    assert aggregate(await collect(plain.chat(chat(stream=False)))).text == "Hello big world"
    await plain.close()
    hung = OpenAIBackend(config(openai_fake.url, always_stream=False, first_token_timeout=5, total_timeout=0.1))
    with pytest.raises(BackendTimeout, match="within 0.1s"):
        await collect(hung.chat(chat(stream=False)))
    await hung.close()


@pytest.mark.parametrize("rows", [[{"index": 0}], [{"index": 0, "embedding": "x"}], "rows"])
async def test_embeddings_of_the_wrong_shape_are_the_backends_fault(backend, openai_fake, rows):
    openai_fake.script.answer = {"object": "list", "data": rows}  # valid JSON, `embedding` missing or odd
    with pytest.raises(BackendError, match="unexpected shape") as e:
        await backend.embed(EmbedRequest(model=MODEL, inputs=["a"]))
    assert e.value.status == 502


def test_logprobs_keep_a_tokens_own_bytes_and_refuse_bytes_that_are_not_a_list():
    """llama-server's and vLLM's `bytes` for part of a character; `bytes: 5` is a backend's mistake (bytes(5)
    would have been five zero bytes)."""
    from adapters.openai_wire import logprobs_from_wire
    [part] = logprobs_from_wire({"content": [{"token": "\ufffd", "logprob": -0.1, "bytes": [165], "top_logprobs": []}]})
    assert (part.token, part.utf8) == ("\ufffd", [165])
    with pytest.raises(TypeError):
        logprobs_from_wire({"content": [{"token": "a", "logprob": -0.1, "bytes": 5}]})


@pytest.mark.parametrize("owner", ["vllm", "sglang", "fake"])
async def test_vllm_keeps_each_keys_prefixes_apart_under_cache_salt(openai_fake, owner):
    """vLLM's `cache_salt` (0.9+) is the request's prefix scope, so a key's cached_tokens and first-token time tell
    it nothing of another key's prompts; other servers have no such field (OpenAI's own refuses unknown ones)."""
    openai_fake.owner = owner
    b = OpenAIBackend(config(openai_fake.url))
    try:
        await b.list_models()
        await collect(b.chat(ChatRequest(MODEL, [Message("user", "hi")], prefix_scope="3f2a")))
        await collect(b.complete(CompletionRequest(MODEL, "def f(", raw=True, prefix_scope="3f2a")))
        salts = [openai_fake.last(path).get("cache_salt") for path in ("/v1/chat/completions", "/v1/completions")]
        assert salts == (["3f2a", "3f2a"] if owner == "vllm" else [None, None])
        await collect(b.chat(chat()))  # no key: no scope, no salt
        assert "cache_salt" not in openai_fake.last("/v1/chat/completions")
        openai_fake.script.refused_field = "cache_salt"  # vLLM 0.9-0.10 on its V0 engine: every keyed request a 400
        sent = len(openai_fake.requests)
        for _ in range(2):
            out = await collect(b.chat(ChatRequest(MODEL, [Message("user", "hi")], prefix_scope="3f2a")))
            assert out[-1].finish_reason == "stop"
        asked = [r.body for r in openai_fake.requests[sent:] if r.path == "/v1/chat/completions"]
        if owner == "vllm":  # refused once, then sent again and never again with it
            assert ["cache_salt" in body for body in asked] == [True, False, False]
    finally:
        await b.close()


async def test_llama_server_as_an_openai_server_gets_a_connection_a_request(llama_chat, openai_fake):
    """llama-server closes its connection after each stream though its head says keep-alive: a pooled one was taken
    for the next request as it closed, a 502 "closed the connection before answering" under load. Known by its
    `Server` header, also where the config names the models and nothing lists them (the conformance suite's
    upstream, which still met the 502)."""
    llama = OpenAIBackend(config(llama_chat.url))
    named = OpenAIBackend(config(llama_chat.url, models=["smollm2"]))
    fake = OpenAIBackend(config(openai_fake.url))
    try:
        name = (await llama.list_models())[0].name
        await fake.list_models()
        assert not llama.http.pooled and fake.http.pooled  # vLLM, SGLang, the fake keep theirs alive
        assert named.http.pooled and await named.list_models() and named.http.pooled  # not asked: not known yet
        await collect(named.chat(ChatRequest("smollm2", [Message("user", "Hi")],
                                             options=SamplingOptions(max_tokens=2))))
        assert not named.http.pooled
        for _ in range(5):
            chunks = await collect(llama.chat(ChatRequest(name, [Message("user", "Hi")],
                                                          options=SamplingOptions(max_tokens=2))))
            assert chunks[-1].finish_reason in ("stop", "length")
    finally:
        for backend in (llama, named, fake):
            await backend.close()


def test_a_tool_call_index_of_null_is_read_as_none_given_and_one_of_another_type_is_the_backends_mistake():
    """Fragments indexed null and 0 made sorting them a TypeError outside the parse step: a 500."""
    from adapters.openai_wire import ChatStream

    def event(index, **fn):
        return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, "function": fn}]}}]}
    stream = ChatStream()
    stream.feed(event(None, name="get", arguments='{"a":'))
    stream.feed(event(0, arguments=" 1}"))
    stream.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    assert [(c.name, c.arguments) for c in stream.last().tool_calls] == [("get", {"a": 1})]
    with pytest.raises(TypeError):
        ChatStream().feed(event("0", name="get"))


def test_a_whole_answer_is_folded_as_aggregate_folds_the_streamed_chunks():
    """A one-answer request's events are folded by the parser (`ChatStream(whole=True)`), not made Chunks and
    folded by `aggregate`: both give the same answer, text before a malformed call's raw text included."""
    from adapters.openai_wire import ChatStream
    top = [{"token": "b", "logprob": -2.0}]
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
              {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]},
              {"choices": [{"index": 0, "delta": {"content": "a"},
                            "logprobs": {"content": [{"token": "a", "logprob": -0.5, "top_logprobs": top}]}}]},
              {"choices": [{"index": 0, "delta": {"content": "é", "reasoning": "!"}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c0", "function": {
                  "name": "f", "arguments": '{"x": 1e5}'}}, {"index": 1, "function": {"name": "g", "arguments": "{"}}]},
                            "finish_reason": "stop", "stop_reason": "END"}]},
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}]
    streamed, whole = ChatStream(), ChatStream(whole=True)
    chunks = [c for e in events if (c := streamed.feed(orjson.loads(orjson.dumps(e)))) is not None]
    assert all(whole.feed(orjson.loads(orjson.dumps(e))) is None for e in events)
    folded = aggregate([*chunks, streamed.last()])
    assert whole.last() == folded and folded.text.startswith("aé{") and folded.tool_calls[0].text == '{"x": 1e5}'


def test_choice_zero_is_read_wherever_it_is_in_an_events_list():
    """Choice 0 is read in place where it comes first (every server seen), and looked for where it does not."""
    from adapters.openai_wire import ChatStream
    stream = ChatStream()
    assert stream.feed({"choices": [{"index": 0, "delta": {"content": "a"}}]}).text == "a"
    assert stream.feed({"choices": [{"index": 1, "delta": {"content": "x"}}, {"delta": {"content": "b"}}]}).text == "b"
    assert stream.feed({"choices": [{"index": 1, "delta": {"content": "x"}}]}) is None
    assert stream.feed({"choices": None, "usage": {"prompt_tokens": 2}}) is None and stream.usage.prompt_tokens == 2
