"""The llamacpp adapter against the real llama-server (tests/llama_server.py) with the shipped SmolLM2 GGUF.

Greedy decoding keeps answers reproducible; short `max_tokens` keep the whole file to a few seconds of CPU."""
import asyncio
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import replace

import aiohttp
import orjson
import pytest
from aiohttp import web

from adapters.base import BackendConfig
from adapters.errors import BackendError, BackendTimeout, BackendUnavailable, BadRequest, ModelLacks, Unsupported
from adapters.llamacpp import LlamaCppBackend, capabilities, parameter_size
from adapters.model_file import model_file
from adapters.openai_wire import ChatStream
from adapters.protocol import (ChatRequest, CompletionRequest, EmbedRequest, Message, SamplingOptions, Tool,
                               ToolCall, aggregate)
from tests.llama_server import LlamaServer, model_path

MODEL = "SmolLM2-135M-Instruct.Q4_1"
GREEDY = SamplingOptions(max_tokens=6, temperature=0)
WEATHER = Tool(name="get_weather", description="Get the current weather for a city",
               parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
# One earlier call in the history is what it takes for the 135M model to call the tool itself.
TOOL_HISTORY = [Message(role="user", content="Weather in Rome?"),
                Message(role="assistant", tool_calls=[ToolCall(name="get_weather", arguments={"city": "Rome"},
                                                               id="c1")]),
                Message(role="user", content="Weather in Paris?")]


@pytest.fixture
async def backend(llama_chat):
    b = LlamaCppBackend(BackendConfig(name="llama", kind="llamacpp", urls=[llama_chat.url]))
    yield b
    await b.close()


async def collect(stream):
    return [c async for c in stream]


def hello(stream=True, **kw) -> ChatRequest:
    return ChatRequest(model=MODEL, messages=[Message(role="user", content="Say hello")], stream=stream,
                       options=GREEDY, **kw)


async def test_server_facts(backend, llama_chat):
    assert await backend.health()
    assert await backend.concurrency() == 4  # -np 4
    assert await backend.context_length() == 512  # -c 2048 split over 4 slots
    [info] = await backend.list_models()
    assert (info.name, info.format, info.quantization_level, info.parameter_size) == (MODEL, "gguf", "Q4_1", "135M")
    local = model_file(model_path())  # llama-server runs here: its file's date and digest, not 1970 and ""
    assert (info.modified_at, info.digest) == (local.modified_at, local.digest)
    assert info.family == (await backend.show(MODEL)).family == "llama"  # /api/tags as /api/show, from the file
    assert {"completion", "tools", "insert"} <= set(info.capabilities) and "{{ .Suffix }}" in info.template
    assert (parameter_size(1_543_714_304), parameter_size(0)) == ("1.5B", "")
    capped = LlamaCppBackend(BackendConfig(name="l", kind="llamacpp", urls=[llama_chat.url], max_concurrency=2))
    assert await capped.concurrency() == 2


async def test_chat_stream_matches_non_stream_and_honours_max_tokens(backend):
    streamed = await collect(backend.chat(hello()))
    whole = aggregate(await collect(backend.chat(hello(stream=False))))
    assert len(streamed) > 1 and "".join(c.text for c in streamed) == whole.text != ""
    for out in (aggregate(streamed), whole):
        assert out.finish_reason == "length" and out.usage.completion_tokens == 6 and out.usage.prompt_tokens > 0


async def test_usage_counts_the_prompt_tokens_the_server_kept(backend):
    """llama-server reuses a slot's prompt: its count of them (OpenAI route `prompt_tokens_details`, native
    `timings.cache_n`) is the usage's `cached_tokens`."""
    question = ChatRequest(model=MODEL, messages=[Message(role="user", content="Name the planets of the sun, please.")],
                           options=GREEDY)
    await collect(backend.chat(question))
    again = aggregate(await collect(backend.chat(question)))
    assert 0 < again.usage.cached_tokens < again.usage.prompt_tokens
    prompt = CompletionRequest(model=MODEL, prompt="The planets of the sun are", raw=True, options=GREEDY)
    await collect(backend.complete(prompt))
    again = aggregate(await collect(backend.complete(prompt)))
    assert 0 < again.usage.cached_tokens < again.usage.prompt_tokens


async def test_timings_without_usage_count_the_whole_prompt(llama_chat):
    """A stream that ends with llama.cpp's `timings` and no `usage` (llama-server's, asked without include_usage):
    `prompt_n` is the tokens it read after the `cache_n` its slot kept, and was taken for the whole prompt. Asked
    again, a 29-token prompt was 1 prompt token of which 28 cached: Anthropic's input_tokens -27."""
    body = {"messages": [{"role": "user", "content": "Name the planets of the sun, please."}], "max_tokens": 2,
            "temperature": 0}
    async with aiohttp.ClientSession() as s:
        async with s.post(llama_chat.url + "/v1/chat/completions", json=body) as resp:
            prompt = (await resp.json())["usage"]["prompt_tokens"]
        async with s.post(llama_chat.url + "/v1/chat/completions", json={**body, "stream": True}) as resp:
            events = [orjson.loads(line[6:]) for line in (await resp.read()).split(b"\n")
                      if line.startswith(b"data: {")]
    stream = ChatStream()
    for event in events:
        stream.feed(event)
    assert stream.usage is not None and not any("usage" in e for e in events)
    assert (stream.usage.prompt_tokens, stream.usage.cached_tokens > 0) == (prompt, True)


async def test_a_prefilled_chat_answers_only_what_the_model_adds(backend):
    """llama-server sends the prefill back joined to the first token ("Hello, welcome"); the adapter takes it off,
    streamed or whole, so the answer holds only the continuation, as Ollama's does."""
    said = [Message(role="user", content="Say hello"), Message(role="assistant", content="Hello,")]
    req = ChatRequest(model=MODEL, messages=said, options=GREEDY)
    streamed = aggregate(await collect(backend.chat(req)))
    whole = aggregate(await collect(backend.chat(replace(req, stream=False))))
    assert streamed.text == whole.text and streamed.text.startswith(" ") and "Hello," not in streamed.text


async def test_an_empty_last_assistant_turn_prefills_nothing(backend):
    """Anthropic's API allows an empty last assistant turn and answers as without it. llama-server took it for a
    prefill of nothing and cut the prompt before the turn, generation prompt and all: the model wrote the turn's
    header into its answer ("assistant\\nHello there")."""
    plain = hello(stream=False)
    ended = replace(plain, messages=[*plain.messages, Message(role="assistant")])
    asked, answered = [aggregate(await collect(backend.chat(r))) for r in (plain, ended)]
    assert answered.usage.prompt_tokens == asked.usage.prompt_tokens and not answered.text.startswith("assistant")
    assert await backend.count_tokens(ended) == await backend.count_tokens(plain)


async def _generating(aiohttp_server, template: str, pieces: list[str], routed: str = "") -> LlamaCppBackend:
    """A llama-server double for Ollama's non-raw /api/generate: its template, and /completion streaming `pieces`;
    with `routed` (a model file), a router (server-models.cpp), whose /props has no template, serving that file."""
    async def completion(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, piece in enumerate(pieces):
            last = {"stop": True, "stop_type": "eos"} if i == len(pieces) - 1 else {}
            await resp.write(b"data: " + orjson.dumps({"content": piece, "tokens": [4 + i], **last}) + b"\n\n")
        return resp

    def answer(obj: dict) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(obj)
        return handler

    app = web.Application()
    router = {"role": "router", "model_path": "none", "default_generation_settings": {"n_ctx": 0}}
    app.router.add_get("/props", answer(router if routed else {"chat_template": template, "total_slots": 1}))
    app.router.add_get("/v1/models", answer({"data": [{"id": MODEL, "status": {"value": "loaded",
                                                                                "args": ["-m", routed]}}]}))
    app.router.add_post("/apply-template", answer({"prompt": "x"}))
    app.router.add_post("/tokenize", answer({"tokens": [1, 2, 3]}))
    app.router.add_post("/completion", completion)
    server = await aiohttp_server(app)
    return LlamaCppBackend(BackendConfig(name="l", kind="llamacpp", urls=[str(server.make_url(""))]))


async def test_a_chats_images_count_as_ollama_counts_them(aiohttp_server):
    """The fit stage's count of a chat with images: llama-server tokenizes the rendered text, where each is a marker,
    and a question with two screenshots counted as the question alone (here 3 tokens), passing a window it overflows.
    Each adds Ollama's figure (server/prompt.go); the cheap bound's 16,384 would overflow every window under it."""
    fake = await _generating(aiohttp_server, "", ["Hi"])
    try:
        pictures = [Message("user", "what is this", images=["aGk=", "aGk="])]
        assert await fake.count_tokens(replace(hello(), messages=pictures)) == 3 + 2 * 768
        assert await fake.count_tokens(hello()) == 3
    finally:
        await fake.close()


MARKER = "<__media_T3st__>"  # llama-server's media marker, random per start unless LLAMA_MEDIA_MARKER pins it


async def seeing_llama(aiohttp_server, sent: list[tuple[str, dict]], routed: bool = False) -> LlamaCppBackend:
    """A llama-server double with a projector (/props `modalities.vision`): its /apply-template puts its marker where
    each image_url part was (oaicompat_content_load_media), as the real one does; every POST body goes to `sent`.
    `routed`: a router, whose own /props has no marker, its model's server's with `?model=` (server-models.cpp)."""
    def rendered(body: dict) -> str:
        parts = [p for m in body["messages"] for p in (m["content"] if isinstance(m["content"], list)
                                                      else [{"type": "text", "text": m["content"]}])]
        return "".join(MARKER if p["type"] == "image_url" else p["text"] for p in parts)

    async def post(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        sent.append((request.path, body))
        if request.path == "/apply-template":
            return web.json_response({"prompt": "<|user|>" + rendered(body)})
        if request.path == "/tokenize":
            return web.json_response({"tokens": list(range(len(body["content"].split())))})
        if request.path == "/detokenize":
            return web.json_response({"content": "Earlier. "})
        if request.path == "/infill":
            return web.json_response({"error": {"code": 501, "message": "no FIM tokens"}}, status=501)
        if request.path == "/v1/chat/completions":
            return web.json_response({"choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "A cat"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        return web.json_response({"content": "A cat", "tokens": [9], "stop": True, "stop_type": "eos"})

    app = web.Application()
    props = {"chat_template": "", "total_slots": 1, "modalities": {"vision": True}, "media_marker": MARKER}
    router = {"role": "router", "model_path": "none", "default_generation_settings": {"n_ctx": 0}}
    app.router.add_get("/props", lambda r: web.json_response(router if routed and "model" not in r.query else props))
    app.router.add_get("/v1/models", lambda _: web.json_response({"data": [{"id": MODEL}]}))
    app.router.add_get("/health", lambda _: web.json_response({"status": "ok"}))
    app.router.add_post("/{path:.*}", post)
    server = await aiohttp_server(app)
    return LlamaCppBackend(BackendConfig(name="l", kind="llamacpp", urls=[str(server.make_url(""))],
                                         always_stream=False))


async def test_a_generates_images_reach_completion_with_a_marker_each(aiohttp_server):
    """Ollama's /api/generate with `images` (the `ollama` client's generate(images=[...])): /completion took the
    rendered prompt's token ids, where each image was only its marker's text, and no image at all. Now the prompt
    goes as text with the images in `multimodal_data`, one marker each: where the chat template put them, or ahead of
    the prompt in a client's Go template (Ollama's "[img-N]" tags); an earlier `context` as its text, as Ollama
    detokenizes it, and the conversation's ids without the markers."""
    sent: list[tuple[str, dict]] = []
    fake = await seeing_llama(aiohttp_server, sent)
    pictures = CompletionRequest(model=MODEL, prompt="what is this", images=["aGk=", "aGk="], stream=False)
    try:
        for req, starts in [(pictures, "<|user|>"), (replace(pictures, context=[5, 6]), "Earlier. <|user|>"),
                            (replace(pictures, template="Q: {{ .Prompt }}"), "Q: ")]:
            sent.clear()
            answer = aggregate(await collect(fake.complete(req)))
            [prompt] = [body["prompt"] for path, body in sent if path == "/completion"]
            assert prompt["multimodal_data"] == ["aGk=", "aGk="] and prompt["prompt_string"].count(MARKER) == 2
            assert prompt["prompt_string"].startswith(starts) and "what is this" in prompt["prompt_string"]
            assert not any(MARKER in body.get("content", "") for path, body in sent if path == "/tokenize")
            assert answer.text == "A cat" and answer.context[:len(req.context or [])] == (req.context or [])
        sent.clear()
        await collect(fake.complete(replace(pictures, images=[])))  # no images: token ids, as before
        assert [body["prompt"] for path, body in sent if path == "/completion"] == [[0, 1, 2]]
    finally:
        await fake.close()


async def test_a_routers_model_marks_its_images_with_its_own_servers_marker(aiohttp_server):
    """Each model of a router runs in a server of its own, with a marker of its own, which the router's /props lacks:
    a client's Go template put mtmd's default `<__media__>` for the image (its server found no marker for it), and
    the conversation's ids kept the markers' text."""
    sent: list[tuple[str, dict]] = []
    fake = await seeing_llama(aiohttp_server, sent, routed=True)
    pictures = CompletionRequest(model=MODEL, prompt="what is this", images=["aGk="], stream=False)
    try:
        for req in (pictures, replace(pictures, template="{{ .Prompt }}")):
            await collect(fake.complete(req))
    finally:
        await fake.close()
    assert [body["prompt"]["prompt_string"].count(MARKER) for path, body in sent if path == "/completion"] == [1, 1]
    assert not any(MARKER in body.get("content", "") for path, body in sent if path == "/tokenize")


async def test_a_raw_generates_images_go_where_its_img_tags_are(aiohttp_server):
    """Ollama reads a raw prompt's images only at its "[img-N]" tags (N: the image's place in `images`), once per tag;
    one no tag names is not read, and a tag naming no image is its "invalid image index" (runner/ollamarunner). The
    raw prompt went to /completion as text: the tags as words, and no image."""
    sent: list[tuple[str, dict]] = []
    fake = await seeing_llama(aiohttp_server, sent)
    tagged = CompletionRequest(model=MODEL, prompt="[img-1] beside [img-0], again [img-1]?", raw=True,
                               images=["MA==", "MQ==", "Mg=="], stream=False)
    try:
        [answer] = await collect(fake.complete(tagged))
        with pytest.raises(BadRequest, match="invalid image index: 3"):
            await collect(fake.complete(replace(tagged, prompt="[img-0] and [img-3]")))
        await collect(fake.complete(replace(tagged, prompt="no tags")))
    finally:
        await fake.close()
    assert [body["prompt"] for path, body in sent if path == "/completion"] == [
        {"prompt_string": f"{MARKER} beside {MARKER}, again {MARKER}?", "multimodal_data": ["MQ==", "MA==", "MQ=="]},
        "no tags"]
    assert answer.text == "A cat" and answer.context is None


async def test_a_raw_generates_tagged_images_count_once_per_tag(aiohttp_server):
    """The fit stage's count of what `complete` sends for a raw prompt: its text without the "[img-N]" tags, and
    Ollama's 768 for each tag (an image twice for a tag used twice, an image no tag names not at all). The tags were
    counted as their text: 5 tokens here for a prompt of three pictures, which passed any window."""
    fake = await seeing_llama(aiohttp_server, [])
    tagged = CompletionRequest(model=MODEL, prompt="[img-1] beside [img-0], again [img-1]?", raw=True,
                               images=["MA==", "MQ==", "Mg=="], stream=False)
    try:
        assert await fake.count_tokens(tagged) == len(" beside , again ?".split()) + 3 * 768
        assert await fake.count_tokens(replace(tagged, prompt="no tags")) == 2
    finally:
        await fake.close()


async def test_a_generates_images_for_a_server_without_a_projector_are_ollamas_400(backend):
    """The real SmolLM2 server cannot see: a generate's images are Ollama's 400 "does not support vision", as a
    chat's are (its /apply-template's 500), with a client's Go template too, or a raw prompt's "[img-0]", where
    /completion refuses them."""
    pictures = CompletionRequest(model=MODEL, prompt="what is this", images=["aGk="], options=GREEDY)
    for req in (pictures, replace(pictures, template="{{ .Prompt }}"), replace(pictures, prompt="[img-0]", raw=True)):
        with pytest.raises(ModelLacks, match="does not support vision"):
            await collect(backend.complete(req))


async def test_a_think_block_is_split_off_unless_the_request_keeps_it(aiohttp_server, backend):
    """Ollama's `think: false` leaves the block in the text (server/routes.go makes its thinking parser only when
    think is on): a generation's /completion text is not split, and a chat asks llama-server's parser not to."""
    fake = await _generating(aiohttp_server, "{{ '<think>' }}", ["<think>", "Hmm.</think>", "\n\nHi"])
    try:
        req = CompletionRequest(model=MODEL, prompt="x")
        split = aggregate(await collect(fake.complete(req)))
        kept = aggregate(await collect(fake.complete(replace(req, splits_thinking=False))))
    finally:
        await fake.close()
    assert (split.thinking, split.text) == ("Hmm.", "Hi")
    assert (kept.thinking, kept.text) == ("", "<think>Hmm.</think>\n\nHi")
    assert "reasoning_format" not in backend.chat_body(hello())
    assert backend.chat_body(hello(splits_thinking=False))["reasoning_format"] == "none"
    assert aggregate(await collect(backend.chat(hello(splits_thinking=False)))).text  # the real server takes it


async def test_a_generates_context_is_counted_as_it_is_evaluated(backend):
    """The fit stage's count of an Ollama /api/generate: its `context` ids go before the rendered prompt, and were
    left out of the count (a long context judged as fitting, then llama-server's 400)."""
    first = CompletionRequest(model=MODEL, prompt="Hi", options=SamplingOptions(max_tokens=8, temperature=0))
    earlier = aggregate(await collect(backend.complete(first))).context
    req = replace(first, prompt="And then?", context=earlier, options=SamplingOptions(max_tokens=1))
    answer = aggregate(await collect(backend.complete(req)))
    assert answer.usage.prompt_tokens == await backend.count_tokens(req) > len(earlier)


async def test_a_generate_with_its_own_go_template_is_counted_as_that_template_renders_it(backend):
    """Ollama's per-request `template` is what `_with_context` renders and sends; the count rendered the server's
    chat template instead (ChatML's system and turn markers), so the fit stage judged another prompt than the one
    evaluated."""
    req = CompletionRequest(model=MODEL, prompt="And then?", system="Be brief.", template="{{ .System }} {{ .Prompt }}",
                            context=[1, 2, 3], options=SamplingOptions(max_tokens=1))
    answer = aggregate(await collect(backend.complete(req)))
    assert answer.usage.prompt_tokens == await backend.count_tokens(req)


async def test_tool_call_round_trip(backend):
    for stream in (True, False):
        req = ChatRequest(model=MODEL, messages=TOOL_HISTORY, tools=[WEATHER], stream=stream,
                          options=SamplingOptions(max_tokens=40, temperature=0))
        out = aggregate(await collect(backend.chat(req)))
        assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_weather", {"city": "Paris"})]
        assert out.finish_reason == "tool_calls" and out.tool_calls[0].id


async def test_raw_completion_uses_native_endpoint(backend):
    prompt = "The capital of France is"
    req = CompletionRequest(model=MODEL, prompt=prompt, raw=True, options=SamplingOptions(max_tokens=4, temperature=0,
                                                                                         logprobs=True, top_logprobs=2))
    streamed = aggregate(await collect(backend.complete(req)))
    [whole] = await collect(backend.complete(replace(req, stream=False)))  # folded into one chunk by the adapter
    assert (whole.text, whole.usage.completion_tokens) == (streamed.text, streamed.usage.completion_tokens)
    assert [p.token for p in whole.logprobs] == [p.token for p in streamed.logprobs]
    out = whole
    assert out.text and out.finish_reason == "length" and out.usage.completion_tokens == 4
    assert out.usage.prompt_tokens == len(await backend.tokenize(prompt, "smollm2"))
    assert len(out.logprobs) == 4 and all(len(p.top) == 2 and p.logprob <= 0 for p in out.logprobs)
    assert "".join(p.token for p in out.logprobs) == out.text


async def test_logprobs_keep_the_bytes_of_a_token_that_is_part_of_a_character(backend):
    """SmolLM2 writes 日 and 語 as two tokens each. llama-server gives the chosen tokens a whole character each, but
    an alternative that is part of one as U+FFFD with its own bytes: those must reach the client, not EF BF BD."""
    req = CompletionRequest(model=MODEL, prompt="日本語, 日本語, 日本", raw=True,
                            options=SamplingOptions(max_tokens=4, temperature=0, logprobs=True, top_logprobs=1))
    out = aggregate(await collect(backend.complete(req)))
    assert "語" in out.text and bytes(b for p in out.logprobs for b in p.utf8).decode() == out.text
    split = [t for p in out.logprobs for t in p.top if t.token == "\ufffd"]
    assert split and all(t.raw is not None and t.utf8 != list("\ufffd".encode()) for t in split)


async def test_with_always_stream_off_every_path_answers_as_the_stream_does(backend, llama_chat):
    """`always_stream = false` sends one-answer requests as they are: chat, tool calls, the native /completion
    (logprobs) and Ollama's /api/generate with its context read from llama-server's whole answers as from its
    streams."""
    plain = LlamaCppBackend(BackendConfig(name="l", kind="llamacpp", urls=[llama_chat.url], always_stream=False))
    streamed, whole = aggregate(await collect(backend.chat(hello()))), aggregate(await collect(
        plain.chat(hello(stream=False))))
    assert (whole.text, whole.finish_reason, whole.usage.completion_tokens) == (
        streamed.text, streamed.finish_reason, streamed.usage.completion_tokens) and whole.text
    req = ChatRequest(model=MODEL, messages=TOOL_HISTORY, tools=[WEATHER], stream=False,
                      options=SamplingOptions(max_tokens=40, temperature=0))
    called = aggregate(await collect(plain.chat(req)))
    assert [(c.name, c.arguments) for c in called.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert called.finish_reason == "tool_calls"
    raw = CompletionRequest(model=MODEL, prompt="The capital of France is", raw=True, stream=False,
                            options=SamplingOptions(max_tokens=4, temperature=0, logprobs=True, top_logprobs=2))
    [one], [two] = await collect(plain.complete(raw)), await collect(backend.complete(raw))
    assert (one.text, one.finish_reason, [p.token for p in one.logprobs]) == (
        two.text, two.finish_reason, [p.token for p in two.logprobs]) and len(one.logprobs) == 4
    assert one.context is None is two.context  # raw: no context, as Ollama's (was the last sampled token alone)
    said = CompletionRequest(model=MODEL, prompt="Say hello", stream=False, options=GREEDY)
    [one], [two] = await collect(plain.complete(said)), await collect(backend.complete(said))
    assert (one.text, one.context) == (two.text, two.context) and one.context
    await plain.close()


async def test_fill_in_the_middle_goes_through_infill(backend):
    for stream in (True, False):
        req = CompletionRequest(model=MODEL, prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
                                raw=True, stream=stream, options=SamplingOptions(max_tokens=5, temperature=0))
        out = aggregate(await collect(backend.complete(req)))
        assert out.finish_reason in ("stop", "length") and 0 < out.usage.completion_tokens <= 5
        assert out.usage.prompt_tokens > len(await backend.tokenize(req.prompt, req.model))  # the suffix went in too


async def test_an_input_longer_than_the_servers_batch_is_cut_unless_truncate_is_false(llama_embed):
    """llama-server refuses an input over its physical batch (512 here) with a 500, which was Velo's 502 in every
    dialect; it is cut to the batch, as Ollama cuts to the context, and `truncate: false` is Ollama's 400."""
    emb = LlamaCppBackend(BackendConfig(name="emb", kind="llamacpp", urls=[llama_embed.url]))
    try:
        long = "word " * 600
        cut = await emb.embed(EmbedRequest(model=MODEL, inputs=[long, "a cat"]))
        alone = await emb.embed(EmbedRequest(model=MODEL, inputs=["a cat"]))
        assert len(cut.embeddings) == 2 and len(cut.embeddings[0]) == 576 and 512 <= cut.prompt_tokens < 600
        assert cut.embeddings[1] == pytest.approx(alone.embeddings[0], abs=1e-4)
        # n8n and Flowise send truncate false: the 400 names the limit that was hit, not only Ollama's words
        with pytest.raises(BadRequest, match=r"exceeds the context length \(this llama-server embeds at most 512 "):
            await emb.embed(EmbedRequest(model=MODEL, inputs=[long], truncate=False))
    finally:
        await emb.close()


async def test_an_input_is_cut_to_the_clients_num_ctx_unless_truncate_is_false(llama_embed):
    """Ollama's /api/embed embeds at most `options.num_ctx` tokens of an input (server/routes.go EmbedHandler), and
    with `truncate: false` a longer one is its 400, as the engine backend does: llama-server embedded all 101 tokens
    of this input for num_ctx 10, and answered `truncate: false` with a vector."""
    emb = LlamaCppBackend(BackendConfig(name="emb", kind="llamacpp", urls=[llama_embed.url]))
    try:
        long = "word " * 100
        cut = await emb.embed(EmbedRequest(model=MODEL, inputs=[long, "a cat"], options={"num_ctx": 10}))
        ids = await emb.tokenize(long, MODEL, special=True)
        [head] = (await emb.embed(EmbedRequest(model=MODEL, inputs=[ids[:10]]))).embeddings
        [cat] = (await emb.embed(EmbedRequest(model=MODEL, inputs=["a cat"]))).embeddings
        assert cut.prompt_tokens == 10 + 2 and cut.embeddings[0] == pytest.approx(head, abs=1e-4)
        assert cut.embeddings[1] == pytest.approx(cat, abs=1e-4)
        with pytest.raises(BadRequest, match="the input length exceeds the context length"):
            await emb.embed(EmbedRequest(model=MODEL, inputs=[long], truncate=False, options={"num_ctx": 10}))
        fits = await emb.embed(EmbedRequest(model=MODEL, inputs=["a cat"], truncate=False, options={"num_ctx": 10}))
        assert fits.embeddings[0] == pytest.approx(cat, abs=1e-4)
    finally:
        await emb.close()


async def test_inputs_cut_to_the_batch_keep_the_bos_and_eos_the_model_adds():
    """Most embedding models add tokens of their own to a text (a BERT's CLS and SEP, a Llama's BOS): cut inputs go
    as ids, which llama-server embeds as they are, so they went without them, and so did every short input beside
    the long one (another caller's, in a micro-batch): "a cat" came out at cosine 0.87 to itself alone. SmolLM2
    made to add BOS and EOS stands in for such a model."""
    from tests.llama_server import LlamaServer
    server = LlamaServer(["-c", "512", "-np", "1", "-t", "1", "-tb", "1", "--embeddings", "--pooling", "mean",
                          "--override-kv", "tokenizer.ggml.add_bos_token=bool:true",
                          "--override-kv", "tokenizer.ggml.add_eos_token=bool:true"])
    await asyncio.to_thread(server.start)
    emb = LlamaCppBackend(BackendConfig(name="emb", kind="llamacpp", urls=[server.url]))
    try:
        long = "word " * 600
        cut = await emb.embed(EmbedRequest(model=MODEL, inputs=[long, "a cat"]))
        alone = await emb.embed(EmbedRequest(model=MODEL, inputs=["a cat"]))
        assert alone.prompt_tokens == 4  # BOS a cat EOS
        assert cut.embeddings[1] == pytest.approx(alone.embeddings[0], abs=1e-4)
        ids = await emb.tokenize(long, MODEL, special=True)
        assert cut.prompt_tokens == 512 + 4 and (ids[0], ids[-1]) == (1, 2)
        [head] = (await emb.embed(EmbedRequest(model=MODEL, inputs=[ids[:511] + [ids[-1]]]))).embeddings
        assert cut.embeddings[0] == pytest.approx(head, abs=1e-4)  # cut between its BOS and EOS, as Ollama cuts
    finally:
        await emb.close()
        server.stop()


async def test_embeddings_need_the_embedding_instance(backend, llama_embed):
    emb = LlamaCppBackend(BackendConfig(name="emb", kind="llamacpp", urls=[llama_embed.url]))
    result = await emb.embed(EmbedRequest(model=MODEL, inputs=["a cat", "stock prices", "a cat"]))
    await emb.close()
    a, b, c = result.embeddings
    assert len(a) == 576 and a == c and a != b and result.prompt_tokens > 0
    with pytest.raises(Unsupported) as e:  # the chat instance was not started with --embeddings
        await backend.embed(EmbedRequest(model=MODEL, inputs=["x"]))
    assert "--embeddings" in e.value.message


def _processing(url: str) -> bool:
    with urllib.request.urlopen(url + "/slots") as resp:
        return any(s["is_processing"] for s in orjson.loads(resp.read()))


async def test_closing_the_stream_frees_the_slot(backend, llama_chat):
    req = CompletionRequest(model=MODEL, prompt="Once upon a time", raw=True,
                            options=SamplingOptions(max_tokens=400, temperature=0))
    stream = backend.complete(req)
    await stream.__anext__()
    assert await asyncio.to_thread(_processing, llama_chat.url)
    await stream.aclose()
    for _ in range(100):
        if not await asyncio.to_thread(_processing, llama_chat.url):
            break
        await asyncio.sleep(0.05)
    assert not await asyncio.to_thread(_processing, llama_chat.url)


async def test_down_server_reports_unavailable_but_still_starts():
    """It cannot say its slots (the admit stage assumes 4 and asks again: tests/proxy/batching/test_http.py)."""
    b = LlamaCppBackend(BackendConfig(name="gone", kind="llamacpp", urls=["http://127.0.0.1:9"]))
    with pytest.raises(BackendUnavailable):
        await b.concurrency()
    assert not await b.health()
    with pytest.raises(BackendUnavailable) as e:
        await collect(b.chat(hello()))
    assert "'gone'" in e.value.message and e.value.status == 503
    await b.close()


async def test_json_schema_format_constrains_the_output(backend):
    schema = {"type": "object", "properties": {"age": {"type": "integer", "maximum": 150}}, "required": ["age"],
              "additionalProperties": False}
    opts = SamplingOptions(max_tokens=40, temperature=0)
    raw = CompletionRequest(model=MODEL, prompt="Alice is 31 years old. As JSON:", raw=True, format=schema,
                            options=opts)
    chat = ChatRequest(model=MODEL, messages=[Message(role="user", content="How old is Alice (31)? Answer in JSON.")],
                       format=schema, options=opts)
    for out in (aggregate(await collect(backend.complete(raw))), aggregate(await collect(backend.chat(chat)))):
        value = orjson.loads(out.text)
        assert list(value) == ["age"] and isinstance(value["age"], int)


async def test_server_killed_mid_stream_is_a_prompt_error():
    server = await asyncio.to_thread(LlamaServer(["-c", "512", "-np", "1", "-t", "1"]).start)
    b = LlamaCppBackend(BackendConfig(name="doomed", kind="llamacpp", urls=[server.url]))
    req = CompletionRequest(model=MODEL, prompt="Once upon a time", raw=True,
                            options=SamplingOptions(max_tokens=400, temperature=0))
    got = []
    try:
        with pytest.raises(BackendError) as e:
            async with asyncio.timeout(10):
                async for chunk in b.complete(req):
                    got.append(chunk)
                    if len(got) == 2:
                        server.process.kill()
    finally:
        server.stop()
        await b.close()
    assert len(got) >= 2 and "'doomed'" in e.value.message and e.value.status == 502


async def test_a_server_restarted_with_another_model_is_described_as_it_is_now(aiohttp_server):
    """/props is asked again with each listing: the window and fill-in-the-middle of the model running now (before,
    the first answer held until Velo restarted, and its window check let through what the server then refused)."""
    now = {"model_path": "/m/qwen.gguf", "n_ctx": 2048, "infill": 200}
    asked = []

    async def props(request: web.Request) -> web.Response:
        return web.json_response({"model_path": now["model_path"], "total_slots": 1, "chat_template": "",
                                  "default_generation_settings": {"n_ctx": now["n_ctx"]}})

    async def infill(request: web.Request) -> web.Response:
        asked.append(now["model_path"])
        return web.json_response({"content": ""}, status=now["infill"])

    app = web.Application()
    app.router.add_get("/props", props)
    app.router.add_post("/infill", infill)
    app.router.add_get("/v1/models", lambda r: web.json_response({"data": [{"id": now["model_path"]}]}))
    server = await aiohttp_server(app)
    backend = LlamaCppBackend(BackendConfig(name="l", kind="llamacpp", urls=[str(server.make_url(""))]))
    try:
        [first] = await backend.list_models()
        assert (first.context_length, "insert" in first.capabilities) == (2048, True)
        now.update(model_path="/m/smollm2.gguf", n_ctx=1024, infill=501)  # restarted with another model
        [second] = await backend.list_models()
        assert (second.context_length, "insert" in second.capabilities) == (1024, False)
        assert await backend.context_length() == 1024 and asked == ["/m/qwen.gguf", "/m/smollm2.gguf"]
    finally:
        await backend.close()


async def test_the_steps_before_a_generation_wait_first_token_timeout_not_total(aiohttp_server):
    """A stalled llama-server held a request at /apply-template or /tokenize (the fit stage's exact count, Ollama's
    /api/generate) for total_timeout (30 min) before its 504."""
    async def stalled(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.json_response({})

    app = web.Application()
    for path in ("/apply-template", "/tokenize", "/props"):
        app.router.add_route("*", path, stalled)
    server = await aiohttp_server(app)
    b = LlamaCppBackend(BackendConfig(name="llama", kind="llamacpp", urls=[str(server.make_url(""))],
                                      first_token_timeout=0.2, total_timeout=30))
    try:
        for step in (b.tokenize("hi", MODEL), b.count_tokens(ChatRequest(MODEL, [Message("user", "hi")])), b.props()):
            started = asyncio.get_running_loop().time()
            with pytest.raises(BackendTimeout):
                await step
            assert asyncio.get_running_loop().time() - started < 5
    finally:
        await b.close()


@pytest.mark.parametrize("rendered", [{"error": "no template"}, {"prompt": 5}, [1]])
async def test_a_rendered_prompt_of_the_wrong_shape_is_the_backends_502(aiohttp_server, rendered):
    """Ollama's non-raw /api/generate reads /apply-template's `prompt`: an answer without one was a KeyError, a 500."""
    async def apply_template(request: web.Request) -> web.Response:
        return web.json_response(rendered)

    app = web.Application()
    app.router.add_post("/apply-template", apply_template)
    server = await aiohttp_server(app)
    b = LlamaCppBackend(BackendConfig(name="llama", kind="llamacpp", urls=[str(server.make_url(""))]))
    try:
        with pytest.raises(BackendError, match="apply-template"):
            await collect(b.complete(CompletionRequest(model=MODEL, prompt="hi")))
    finally:
        await b.close()


@pytest.mark.parametrize("top", [None, 0, 3])
async def test_logprobs_list_as_many_alternatives_as_asked(backend, top):
    """llama-server gives 20 alternatives where a request names no count, and no logprobs at all for 0; OpenAI,
    Ollama and the engine give none unless asked."""
    opts = replace(GREEDY, logprobs=True, top_logprobs=top)
    chat = aggregate(await collect(backend.chat(replace(hello(), options=opts))))
    raw = aggregate(await collect(backend.complete(CompletionRequest(model=MODEL, prompt="Once", raw=True,
                                                                     options=opts))))
    for out in (chat, raw):
        assert out.logprobs and {len(p.top) for p in out.logprobs} == {top or 0}


async def test_knobs_past_llama_servers_32_bit_integers_and_ollamas_minus_one_are_read_as_meant(backend):
    """4294967299 tokens wrapped to 3 there (an answer cut at 3 tokens), repeat_last_n -1 (Ollama's whole context)
    was its 400, and one past the window sized a buffer of that many tokens."""
    await backend.context_length()  # /props asked, as a listing does
    opts = replace(GREEDY, max_tokens=2**32 + 3, top_k=2**33, repeat_last_n=-1, repeat_penalty=1.1)
    out = aggregate(await collect(backend.chat(replace(hello(), options=opts))))
    assert out.finish_reason == "stop" and out.usage.completion_tokens > 3
    body = backend.chat_body(replace(hello(), options=replace(opts, repeat_last_n=2**31 - 1)))
    assert (body["max_tokens"], body["top_k"], body["repeat_last_n"]) == (2**31 - 1, 0, 512)


async def test_only_llama_servers_own_sampler_keys_pass_from_a_clients_extra_options(backend):
    """Ollama's dialect passes on every option it does not know: `grammar` constrained the answer, `stream`
    overrode Velo's, `n_probs` added logprobs nobody asked for."""
    extra = {"grammar": 'root ::= "yes yes yes"', "stream": False, "n_probs": 3, "mirostat": 0, "xtc_threshold": 0.5}
    req = replace(hello(), options=replace(GREEDY, extra=extra))
    body = backend.chat_body(req)
    assert "grammar" not in body and "n_probs" not in body and body["stream"] is True
    assert body["mirostat"] == 0 and body["xtc_threshold"] == 0.5
    out = aggregate(await collect(backend.complete(CompletionRequest(model=MODEL, prompt="Once", raw=True,
                                                                     options=replace(GREEDY, extra=extra)))))
    assert out.text != "yes yes yes" and not out.logprobs


async def test_an_input_longer_than_a_slots_context_is_cut_unless_truncate_is_false():
    """A server whose batch holds more than a slot's context (-ub as large as -c, as the README advises, over two
    slots) refuses such an input as over the context: it was the client's 400 where Ollama cuts it. Cut to the
    whole context it was refused still by a last-token pooled model (room for the token the server adds)."""
    from tests.llama_server import LlamaServer
    server = LlamaServer(["-c", "1024", "-np", "2", "-b", "1024", "-ub", "1024", "-t", "1", "-tb", "1",
                          "--embeddings", "--pooling", "last"])
    await asyncio.to_thread(server.start)
    emb = LlamaCppBackend(BackendConfig(name="emb", kind="llamacpp", urls=[server.url]))
    try:
        long = "word " * 700
        cut = await emb.embed(EmbedRequest(model=MODEL, inputs=[long, "a cat"]))
        assert len(cut.embeddings) == 2 and 512 <= cut.prompt_tokens < 700
        with pytest.raises(BadRequest, match="the input length exceeds the context length"):
            await emb.embed(EmbedRequest(model=MODEL, inputs=[long], truncate=False))
    finally:
        await emb.close()
        server.stop()


async def test_a_generation_cannot_think_where_only_llama_servers_chat_parsers_split_the_thinking(aiohttp_server):
    """Command R7B's markers: its chat thinks (llama-server splits them), but Ollama's /api/generate goes to
    /completion, where Velo splits only <think> blocks; asked to think, its reasoning came inside the answer."""
    r7b = "{% if enable_thinking %}<|START_THINKING|>{% endif %}{{ messages[0]['content'] }}"
    fake = await _generating(aiohttp_server, r7b, ["<|START_THINKING|>Hmm.<|END_THINKING|>", "Hi"])
    try:
        with pytest.raises(ModelLacks):
            await collect(fake.complete(CompletionRequest(model=MODEL, prompt="x", think=True)))
        plain = aggregate(await collect(fake.complete(CompletionRequest(model=MODEL, prompt="x"))))
    finally:
        await fake.close()
    assert plain.text == "<|START_THINKING|>Hmm.<|END_THINKING|>Hi"  # not asked to think: the text as it came


async def test_a_routers_model_thinks_with_its_own_files_template(aiohttp_server, tmp_path):
    """A router's /props has no template: every model of it was refused `think` on /api/generate, and before that
    had its thinking left in the text."""
    from tests.adapters.test_model_card import gguf_file
    path = gguf_file(str(tmp_path / "qwen3.gguf"), ["a", "b"], "{{ '<think>' }}")
    fake = await _generating(aiohttp_server, "", ["<think>", "Hmm.</think>", "\n\nHi"], routed=path)
    try:
        split = aggregate(await collect(fake.complete(CompletionRequest(model=MODEL, prompt="x", think=True))))
    finally:
        await fake.close()
    assert (split.thinking, split.text) == ("Hmm.", "Hi")


async def test_a_routers_model_with_a_projector_sees(aiohttp_server, tmp_path):
    """A router's /v1/models names each model's input modalities (server-models.cpp, from its --mmproj): a model
    with a projector was listed without vision, so its generate's images were the 400 "does not support vision"
    and its chat's a note; one without stays so."""
    from tests.adapters.test_model_card import gguf_file
    path = gguf_file(str(tmp_path / "m.gguf"), ["a", "b"])
    entries = [{"id": name, "status": {"value": "unloaded", "args": ["-m", path]},
                "architecture": {"input_modalities": modalities, "output_modalities": ["text"]}}
               for name, modalities in (("eyes", ["text", "image"]), ("blind", ["text"]))]
    app = web.Application()
    app.router.add_get("/props", lambda _: web.json_response({"role": "router"}))
    app.router.add_get("/v1/models", lambda _: web.json_response({"data": entries}))
    server = await aiohttp_server(app)
    router = LlamaCppBackend(BackendConfig(name="r", kind="llamacpp", urls=[str(server.make_url(""))]))
    try:
        listed = {m.name: "vision" in m.capabilities for m in await router.list_models()}
    finally:
        await router.close()
    assert listed == {"eyes": True, "blind": False}


@pytest.mark.parametrize("jinja, thinks", [
    ("{% if enable_thinking %}<|START_THINKING|>{% endif %}", True),  # Command R7B's: llama-server's parser reads it
    ("{{ '<think>' }}", True), ("{{ m.content.split('</think>')[-1] }}", True), ("{{ m.content }}", False)])
def test_a_llama_server_model_thinks_where_the_servers_parsers_split_it(jinja, thinks):
    """llama-server splits more markers than Velo's own splitter reads: Command R7B's lost its thinking switch."""
    assert ("thinking" in capabilities(jinja, tools=False, infill=False)) == thinks
