"""Real clients (`openai`, `ollama`) -> Velo -> the real llama-server with SmolLM2-135M, in both dialects.

Greedy decoding (temperature 0) makes both dialects see the same tokens, so their answers are compared."""
import asyncio
import time

import aiohttp
import ollama
import openai
import orjson
import pytest

from adapters.base import BackendConfig
from proxy.config import ServerConfig
from tests.adapters.test_llamacpp import MARKER, seeing_llama
from tests.integration.conftest import CHAT_MODEL, EMBED_MODEL, clients, config, serve

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
HELLO = [{"role": "user", "content": "Say hello"}]


async def test_chat_both_dialects_stream_and_not(velo_llama):
    oai, oll = clients(velo_llama)
    whole = await oai.chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=5, temperature=0)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 5
    pieces = [c async for c in await oai.chat.completions.create(
        model=CHAT_MODEL, messages=HELLO, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True})]
    assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == text
    assert [c.choices[0].finish_reason for c in pieces if c.choices][-1] == "length"
    assert pieces[-1].usage.completion_tokens == 5

    parts = [p async for p in await oll.chat(model=CHAT_MODEL, messages=HELLO, stream=True,
                                            options={"num_predict": 5, "temperature": 0})]
    assert len(parts) > 2 and "".join(p.message.content for p in parts) == text
    assert parts[-1].done and parts[-1].done_reason == "length" and parts[-1].eval_count == 5
    assert parts[-1].total_duration > 0
    single = await oll.chat(model=CHAT_MODEL, messages=HELLO, options={"num_predict": 5, "temperature": 0})
    assert single.message.content == text


async def test_tool_calls_round_trip_openai(velo_llama):
    oai, _ = clients(velo_llama)
    history = [{"role": "user", "content": "Weather in Rome?"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
               {"role": "user", "content": "Weather in Paris?"}]
    stream = await oai.chat.completions.create(model=CHAT_MODEL, messages=history, tools=[WEATHER], temperature=0,
                                               max_tokens=40, stream=True)
    calls, finish = {}, None
    async for chunk in stream:
        for d in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"].replace(" ", "")) for c in calls.values()] == [
        ("get_weather", '{"city":"Paris"}')]


async def test_a_forced_call_of_a_tool_with_definitions(velo_llama):
    """instructor's default mode forces a call of its response model's tool, whose schema has `$defs` wherever the
    model nests another or an Enum: the forced call's grammar pointed at definitions it did not hold, a 400."""
    oai, _ = clients(velo_llama)
    tool = {"type": "function", "function": {"name": "Forecast", "parameters": {
        "$defs": {"Unit": {"enum": ["celsius", "fahrenheit"], "type": "string"}}, "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/Unit"}}, "required": ["city", "unit"]}}}
    answer = await oai.chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "Forecast for Paris in celsius"}], tools=[tool],
        tool_choice={"type": "function", "function": {"name": "Forecast"}}, temperature=0, max_tokens=40)
    [call] = answer.choices[0].message.tool_calls
    assert call.function.name == "Forecast" and orjson.loads(call.function.arguments)["unit"] in ("celsius",
                                                                                                  "fahrenheit")


async def test_tool_calls_round_trip_ollama(velo_llama):
    _, oll = clients(velo_llama)
    history = [{"role": "user", "content": "Weather in Rome?"},
               {"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
               {"role": "user", "content": "Weather in Paris?"}]
    parts = [p async for p in await oll.chat(model=CHAT_MODEL, messages=history, tools=[WEATHER], stream=True,
                                            options={"temperature": 0, "num_predict": 40})]
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert parts[-1].done


async def test_fill_in_the_middle_both_dialects(velo_llama):
    oai, oll = clients(velo_llama)
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    plain = await oll.generate(model=CHAT_MODEL, prompt=prefix, raw=True, options={"num_predict": 4,
                                                                                 "temperature": 0})
    fim = await oll.generate(model=CHAT_MODEL, prompt=prefix, suffix=suffix, raw=True,
                             options={"num_predict": 4, "temperature": 0})
    assert fim.done and fim.response and 0 < fim.eval_count <= 4
    assert fim.prompt_eval_count > plain.prompt_eval_count  # the suffix reached the model (/infill)
    streamed = [p async for p in await oll.generate(model=CHAT_MODEL, prompt=prefix, suffix=suffix, raw=True,
                                                   stream=True, options={"num_predict": 4, "temperature": 0})]
    assert "".join(p.response for p in streamed) == fim.response

    comp = await oai.completions.create(model=CHAT_MODEL, prompt=prefix, suffix=suffix, max_tokens=4, temperature=0)
    assert comp.choices[0].text == fim.response
    assert comp.usage.prompt_tokens == fim.prompt_eval_count


async def test_embeddings_both_dialects_agree(velo_llama):
    oai, oll = clients(velo_llama)
    native = await oll.embed(model=EMBED_MODEL, input=["a cat", "stock prices"])
    assert len(native.embeddings) == 2 and len(native.embeddings[0]) == 576
    assert native.embeddings[0] != native.embeddings[1]
    compat = await oai.embeddings.create(model=EMBED_MODEL, input=["a cat", "stock prices"])
    assert [d.index for d in compat.data] == [0, 1]
    for mine, theirs in zip(native.embeddings, (d.embedding for d in compat.data)):
        assert mine == pytest.approx(theirs, abs=1e-6)


async def test_dimensions_hold_where_an_openai_compatible_upstream_ignores_them(llama_embed):
    """llama-server's /v1/embeddings ignores `dimensions` (576 values for 4): through the openai kind the vectors
    came back whole, a length the client did not ask for (a pgvector(4) column refuses it). Shortened as Ollama does
    (engine and llamacpp backends alike)."""
    cfg = config(BackendConfig(name="compat", kind="openai", urls=[llama_embed.url + "/v1"], models=[EMBED_MODEL]))
    async with serve(cfg) as url:
        oai, _ = clients(url)
        whole = (await oai.embeddings.create(model=EMBED_MODEL, input="a cat", encoding_format="float")).data[0]
        short = (await oai.embeddings.create(model=EMBED_MODEL, input="a cat", dimensions=4)).data[0]
    norm = sum(x * x for x in whole.embedding[:4]) ** 0.5
    assert len(whole.embedding) == 576
    assert short.embedding == pytest.approx([x / norm for x in whole.embedding[:4]], abs=1e-5)


async def test_a_required_call_through_the_openai_kind_to_llama_server_is_a_call(llama_chat):
    """The openai kind trusted every server to force `tool_choice: "required"` as vLLM and SGLang do; llama-server's
    /v1 (as Ollama's, which has no tool_choice) answered in prose ("Here's a JSON object with the weather in
    Paris: ..." to the length limit), and the client got no call. A server that has not said it is one of those
    gets the call's schema as its output format, as the llamacpp kind does."""
    cfg = config(BackendConfig(name="compat", kind="openai", urls=[llama_chat.url + "/v1"], models=[CHAT_MODEL]))
    async with serve(cfg) as url:
        oai, _ = clients(url)
        out = await oai.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "Weather?"}],
                                                tools=[WEATHER], tool_choice="required", max_tokens=40, temperature=0)
    assert out.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in out.choices[0].message.tool_calls] == ["get_weather"]


async def test_model_listing_and_show(velo_llama):
    oai, oll = clients(velo_llama)
    # Ollama lists every name with its tag
    assert sorted(m.model for m in (await oll.list()).models) == sorted([CHAT_MODEL, f"{EMBED_MODEL}:latest"])
    assert sorted(m.id for m in (await oai.models.list()).data) == sorted([CHAT_MODEL, EMBED_MODEL])
    shown = await oll.show(CHAT_MODEL)
    assert {"completion", "tools", "insert"} <= set(shown.capabilities)
    # the context a request gets (a slot: -c 2048 over 4), not the file's 8192: clients size prompts by it
    assert shown.modelinfo["llama.context_length"] == 512 and "num_ctx                        512" in shown.parameters
    assert shown.modelinfo["llama.block_count"] == 30  # the rest is the file's
    assert shown.template.startswith("{{- if .Suffix }}")
    assert shown.details.format == "gguf" and shown.details.quantization_level == "Q4_1"


async def test_a_generates_images_reach_a_server_that_sees_and_one_that_cannot_refuses_them(velo_llama,
                                                                                             aiohttp_server):
    """The `ollama` client's generate(images=[...]) and chat with images: a llama-server with a projector (/props
    `modalities.vision`) was listed without `vision`, so the generate was Ollama's 400 "does not support vision"
    and the chat's image became a note; the real SmolLM2 server, which cannot see, still refuses the generate."""
    _, oll = clients(velo_llama)
    with pytest.raises(ollama.ResponseError) as e:
        await oll.generate(model=CHAT_MODEL, prompt="what is this", images=[b"\x89PNG"])
    assert (e.value.status_code, e.value.error) == (400, f'"{CHAT_MODEL}" does not support vision')
    sent: list[tuple[str, dict]] = []
    seeing = await seeing_llama(aiohttp_server, sent)
    await seeing.close()
    eyes = BackendConfig(name="eyes", kind="llamacpp", urls=seeing.config.urls, models=["eyes"], always_stream=False)
    async with serve(config(eyes)) as url:
        oll = ollama.AsyncClient(host=url)
        assert (await oll.generate(model="eyes", prompt="what is this", images=[b"\x89PNG"])).response == "A cat"
        assert "vision" in (await oll.show("eyes")).capabilities
        await oll.chat(model="eyes", messages=[{"role": "user", "content": "and this?", "images": [b"\x89PNG"]}])
    [prompt] = [body["prompt"] for path, body in sent if path == "/completion"]
    assert prompt["multimodal_data"] == ["iVBORw=="] and prompt["prompt_string"].count(MARKER) == 1
    [chat] = [body for path, body in sent if path == "/v1/chat/completions"]
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}
    assert chat["messages"][-1]["content"][-1] == picture


async def test_n_choices_take_one_slot_each_and_up_to_16_are_served(velo_llama, llama_chat):
    """Each choice is one generation with n=1 on the wire: n=2 occupies 2 of llama-server's 4 slots (before: 4,
    the backend asked for n on each of the n calls), and n up to 16 (Velo's limit) is served (before: failed)."""
    import aiohttp
    oai, _ = clients(velo_llama)
    story = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
    stream = await oai.chat.completions.create(model=CHAT_MODEL, messages=story, n=2, max_tokens=400,
                                               temperature=0.8, stream=True)
    busy = []
    async with aiohttp.ClientSession() as s:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and len(busy) < 20:
                async with s.get(f"{llama_chat.url}/slots") as r:
                    busy.append(sum(slot["is_processing"] for slot in await r.json()))
    assert max(busy) == 2, busy
    many = await oai.chat.completions.create(model=CHAT_MODEL, messages=HELLO, n=16, max_tokens=3, temperature=0.8)
    assert sorted(c.index for c in many.choices) == list(range(16))
    assert all(c.message.content for c in many.choices)


async def test_ignore_eos_writes_to_max_tokens(velo_llama):
    """vLLM's, SGLang's and llama-server's `ignore_eos` (load generators send it for answers of a fixed length): the
    model writes on past its end of text. It was dropped, so the answer stopped early."""
    oai, _ = clients(velo_llama)
    asked = {"model": CHAT_MODEL, "messages": HELLO, "max_tokens": 200, "temperature": 0}
    natural = await oai.chat.completions.create(**asked)
    assert natural.choices[0].finish_reason == "stop" and natural.usage.completion_tokens < 200
    longer = natural.usage.completion_tokens + 16
    forced = await oai.chat.completions.create(**{**asked, "max_tokens": longer}, extra_body={"ignore_eos": True})
    assert forced.choices[0].finish_reason == "length" and forced.usage.completion_tokens == longer


async def test_an_empty_completions_prompt_starts_a_new_document(velo_llama):
    """OpenAI's completions take an empty prompt "as if from the beginning of a new document" (the engine starts it
    from the model's BOS); llama-server evaluated nothing and answered nothing, passed on as an empty `stop`."""
    oai, _ = clients(velo_llama)
    for stream in (False, True):
        out = await oai.completions.create(model=CHAT_MODEL, prompt="", max_tokens=4, temperature=0, stream=stream,
                                           **({"stream_options": {"include_usage": True}} if stream else {}))
        if stream:
            chunks = [c async for c in out]
            text, usage = "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage
        else:
            text, usage = out.choices[0].text, out.usage
        assert text and (usage.prompt_tokens, usage.completion_tokens) == (1, 4)


async def test_token_ids_embed_as_their_text_does(velo_llama):
    """OpenAI's and llama-server's token input (the openai client sends ids itself where tiktoken chunks a long
    text); Velo refused it. llama-server embeds ids with no BOS of its own, and counts each id a token."""
    oai, _ = clients(velo_llama)
    async with aiohttp.ClientSession() as http:  # llama-server's own /tokenize, through Velo
        async with http.post(velo_llama + "/tokenize", json={"model": EMBED_MODEL, "content": "a cat"}) as resp:
            ids = (await resp.json())["tokens"]
    text = await oai.embeddings.create(model=EMBED_MODEL, input="a cat")
    given = await oai.embeddings.create(model=EMBED_MODEL, input=[ids, ids[:1]])
    assert len(given.data) == 2 and given.usage.prompt_tokens == len(ids) + 1
    assert given.data[0].embedding == pytest.approx(text.data[0].embedding, abs=1e-5)
    with pytest.raises(openai.BadRequestError, match="invalid tokens"):  # past SmolLM2's 49,152: llama-server's 400
        await oai.embeddings.create(model=EMBED_MODEL, input=[49152])


async def test_llama_servers_own_embedding_and_rerank_aliases_pass_through(velo_llama, llama_embed):
    """llama-server answers /embedding (its own embeddings, not OpenAI's), /reranking and /v1/reranking beside
    /v1/rerank: through Velo they were a 404 "no route" in Ollama's shape."""
    body = {"content": ["a cat", "a dog"]}
    async with aiohttp.ClientSession() as http:
        async with http.post(velo_llama + "/embedding", json={**body, "model": EMBED_MODEL}) as resp:
            assert resp.status == 200, await resp.text()
            through = await resp.json()
        async with http.post(llama_embed.url + "/embedding", json=body) as resp:
            direct = await resp.json()
        assert [r["index"] for r in through] == [0, 1] and through == direct
        for path in ("/reranking", "/v1/reranking"):
            async with http.post(velo_llama + path, json={"model": EMBED_MODEL, "query": "q", "documents": ["a"]}) \
                    as resp:  # llama-server's own answer: this one was not started to rerank
                assert resp.status == 501 and "--reranking" in (await resp.json())["error"]["message"]


async def test_a_completions_prompt_of_token_ids_answers_as_its_text_does(velo_llama):
    """lm-eval's local-completions sends the prompt as token ids by default; Velo refused every token array.
    llama-server reads the ids as they are (no BOS of its own), so they answer as the text they tokenize from."""
    oai, _ = clients(velo_llama)
    async with aiohttp.ClientSession() as http:  # llama-server's own /tokenize, through Velo
        async with http.post(velo_llama + "/tokenize", json={"model": CHAT_MODEL, "content": "The capital of France is",
                                                             "add_special": True}) as resp:
            ids = (await resp.json())["tokens"]
    asked = {"model": CHAT_MODEL, "max_tokens": 6, "temperature": 0}
    text = await oai.completions.create(prompt="The capital of France is", **asked)
    given = await oai.completions.create(prompt=ids, **asked)
    assert given.choices[0].text == text.choices[0].text and given.usage.prompt_tokens == len(ids)
    batch = await oai.completions.create(prompt=[ids, ids[:2]], stream=True, stream_options={"include_usage": True},
                                         **asked)
    texts: dict[int, str] = {}
    async for chunk in batch:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts[0] == text.choices[0].text and texts[1] and chunk.usage.prompt_tokens == len(ids) + 2
    with pytest.raises(openai.BadRequestError):  # past SmolLM2's 49,152: llama-server's 400
        await oai.completions.create(prompt=[1, 49152], **asked)


async def test_best_of_ranks_llama_servers_candidates_by_their_logprobs(velo_llama):
    """`best_of` was dropped: one sample came back, unranked. Now three candidates of five tokens each (ignore_eos),
    the two most likely per token answered, best first; usage bills all three."""
    oai, _ = clients(velo_llama)
    asked = {"model": CHAT_MODEL, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 1.0,
             "extra_body": {"ignore_eos": True}}
    raw = await oai.completions.with_raw_response.create(best_of=3, n=2, logprobs=1, **asked)
    out = raw.parse()
    assert "X-Velo-Best-Of" not in raw.headers  # ranked: llama-server gave every candidate's logprobs
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in out.choices]
    assert [c.index for c in out.choices] == [0, 1] and means[0] >= means[1]
    assert out.usage.completion_tokens == 15
    plain = await oai.completions.create(best_of=2, **asked)
    assert len(plain.choices) == 1 and plain.choices[0].logprobs is None and plain.usage.completion_tokens == 10


async def test_embeddings_from_a_chat_only_server_are_the_clients_400(velo_llama):
    """A missing model feature is never a 5xx, which the SDKs retry: LiteLLM and the OpenAI SDK sent the 501 of a
    llama-server started without --embeddings three times."""
    oai, oll = clients(velo_llama)
    with pytest.raises(openai.BadRequestError, match="embeddings"):
        await oai.embeddings.create(model=CHAT_MODEL, input="hi")
    with pytest.raises(ollama.ResponseError) as e:
        await oll.embed(model=CHAT_MODEL, input="hi")
    assert e.value.status_code == 400


async def test_an_embed_request_with_no_input_answers_no_embeddings(velo_llama):
    """Ollama loads the model and embeds nothing (EmbedHandler); llama-server refused the empty input with a 400."""
    _, oll = clients(velo_llama)
    for nothing in ([], ""):
        assert (await oll.embed(model=EMBED_MODEL, input=nothing)).embeddings == []


async def test_llama_servers_own_infill_passes_through_as_llama_vscode_sends_it(velo_llama, llama_chat):
    """llama.vscode's autocomplete posts llama-server's /infill (repository context in `input_extra`, its own
    samplers): the answer is llama-server's own, streamed or not, the same as asking it directly."""
    body = {"model": CHAT_MODEL, "input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n",
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
            "prompt": "", "n_predict": 6, "top_k": 1, "samplers": ["top_k"], "cache_prompt": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(velo_llama + "/infill", json=body) as resp:
            assert resp.status == 200, await resp.text()
            through = await resp.json()
        async with http.post(llama_chat.url + "/infill", json=body) as resp:
            direct = await resp.json()
        assert through["content"] == direct["content"] and through["tokens_predicted"] == 6
        async with http.post(velo_llama + "/infill", json={**body, "stream": True}) as resp:
            lines = (await resp.read()).splitlines()
        events = [orjson.loads(line[6:]) for line in lines if line.startswith(b"data: ")]
        assert "".join(e["content"] for e in events) == direct["content"] and events[-1]["stop"] is True
        async with http.post(velo_llama + "/infill", json={k: v for k, v in body.items() if k != "model"}) as resp:
            err = (await resp.json())["error"]  # two llama-server backends: the request must name one
        assert resp.status == 404 and "or several (name one's model with `model`)" in err["message"]


async def test_llama_servers_token_props_and_slot_routes_pass_through(velo_llama, llama_chat):
    """SillyTavern counts tokens with llama-server's /tokenize (without it, it guesses a tokenizer from the model's
    name), and reads /props and /slots: each answer is llama-server's own, the model named in the body or, for a
    GET, in `?model=`, as llama-server's router mode takes it."""
    text = "Hello world, said the fox."
    async with aiohttp.ClientSession() as http:
        async def both(method: str, path: str, body: dict | None = None) -> tuple[dict, dict]:
            answers = []
            for base, ask in ((velo_llama, {"model": CHAT_MODEL}), (llama_chat.url, {})):
                query = f"?{next(iter(ask))}={CHAT_MODEL}" if method == "GET" and ask else ""
                async with http.request(method, base + path + query,
                                        json=None if body is None else {**body, **ask}) as resp:
                    assert resp.status == 200, await resp.text()
                    answers.append(await resp.json())
            return answers[0], answers[1]

        through, direct = await both("POST", "/tokenize", {"content": text})
        assert through == direct and len(through["tokens"]) > 3
        through, direct = await both("POST", "/detokenize", {"tokens": direct["tokens"]})
        assert through == direct and through["content"].strip() == text
        chat = {"messages": [{"role": "user", "content": text}]}
        through, direct = await both("POST", "/apply-template", chat)
        assert through == direct and text in through["prompt"]
        through, direct = await both("GET", "/props")
        assert through["total_slots"] == direct["total_slots"] >= 1 and through["model_path"] == direct["model_path"]
        through, direct = await both("GET", "/slots")
        assert [s["id"] for s in through] == [s["id"] for s in direct]
        async with http.post(velo_llama + "/slots/0?action=erase") as resp:  # two backends: which one is unsaid
            assert resp.status == 404 and "or several" in (await resp.json())["error"]["message"]
        async with http.post(velo_llama + "/v1/rerank", json={"model": CHAT_MODEL, "query": "q",
                                                               "documents": ["a", "b"]}) as resp:
            err = (await resp.json())["error"]  # llama-server's own answer: this one was not started to rerank
        assert resp.status == 501 and "--reranking" in err["message"]
        async with http.post(velo_llama + "/slots/0?action=erase", json={"model": CHAT_MODEL}) as resp:
            err = (await resp.json())["error"]  # llama-server's own refusal: these servers run without a save path
        assert resp.status == 501 and "--slot-save-path" in err["message"]


@pytest.mark.parametrize("path, body", [
    ("/completion", {"prompt": "hello " * 3000, "n_predict": 2}),
    ("/completion", {"prompt": "hello " * 3000, "n_predict": 2, "stream": True}),
    ("/completion", {"prompt": 5}),
    ("/v1/rerank", {"query": "q", "documents": ["a"]})])
async def test_llama_servers_own_errors_come_as_it_answers_them(velo_llama, llama_chat, path, body):
    """A prompt longer than a slot's context is llama-server's 400 `exceed_context_size_error` with `n_prompt_tokens`
    and `n_ctx`, which its clients read to trim; through Velo it was OpenAI's `context_length_exceeded` without
    them, a feature the server lacks a 400 where it answers 501, and every message began "backend 'llama' ..."."""
    async with aiohttp.ClientSession() as http:
        async with http.post(llama_chat.url + path, json=body) as resp:
            direct = resp.status, await resp.json()
        async with http.post(velo_llama + path, json={**body, "model": CHAT_MODEL}) as resp:
            through = resp.status, await resp.json()
    assert through == direct and direct[0] in (400, 501)


@pytest.mark.parametrize("path, body, said", [
    ("/infill", {"input_prefix": "def f():"}, "key 'input_suffix' not found"),
    ("/tokenize", {"content": 5}, "type must be string, but is number"),
    ("/detokenize", {"tokens": "1 2"}, "type must be array, but is string")])
async def test_a_body_llama_server_cannot_read_is_a_400_in_its_shape(velo_llama, llama_chat, path, body, said):
    """llama-server answers 500 `server_error` for a field of the wrong type or a missing one (its /infill check of
    `input_suffix` goes on to read it): passed on as it came, the client's mistake was a 5xx, which clients and
    proxies retry as the server's fault."""
    async with aiohttp.ClientSession() as http:
        async with http.post(llama_chat.url + path, json=body) as resp:
            assert resp.status == 500 and said in (await resp.json())["error"]["message"]
        async with http.post(velo_llama + path, json={**body, "model": CHAT_MODEL}) as resp:
            status, err = resp.status, (await resp.json())["error"]
    assert status == 400 and err["code"] == 400 and err["type"] == "invalid_request_error" and said in err["message"]


async def test_llama_servers_own_model_id_reaches_its_model(velo_llama, llama_chat):
    """A client moved over from llama-server keeps the id its /v1/models gave (the model path, or `--alias`):
    through Velo it reaches that model, where it was a 404 beside Velo's listed name."""
    async with aiohttp.ClientSession() as http:
        async with http.get(llama_chat.url + "/v1/models") as resp:
            own = (await resp.json())["data"][0]["id"]
    oai, _ = clients(velo_llama)
    assert own != CHAT_MODEL and own not in [m.id async for m in oai.models.list()]
    # greedy and 8 tokens: 2 sampled tokens were blank in 1 run of 3
    answer = await oai.chat.completions.create(model=own, max_tokens=8, temperature=0,
                                               messages=[{"role": "user", "content": "Say hi"}])
    assert answer.choices[0].message.content and answer.model == own


async def test_a_stream_stays_alive_while_llama_server_reads_the_prompt(llama_chat):
    """While llama-server reads the prompt: past `heartbeat_s` (a millisecond here) without
    a token, the client gets the headers, OpenAI's role delta and SSE comments before the first token."""
    cfg = config(BackendConfig(name="llama", kind="llamacpp", urls=[llama_chat.url], models=[CHAT_MODEL]),
                 server=ServerConfig(heartbeat_s=0.001))
    prompt = [{"role": "user", "content": "Summarise: " + "the cat sat on the mat and looked at the hat. " * 30}]
    async with serve(cfg) as url, aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/chat/completions", json={"model": CHAT_MODEL, "messages": prompt,
                                                                 "max_tokens": 3, "stream": True}) as resp:
            blocks = (await resp.read()).split(b"\n\n")
    text_at = next(i for i, b in enumerate(blocks) if b'"content":"' in b and b'"content":""' not in b)
    assert b'"role":"assistant"' in blocks[0] and b": keepalive" in blocks[1:text_at]


async def test_a_whole_answer_of_llama_servers_own_route_has_the_whole_answers_time(llama_chat):
    """A /completion not streamed comes whole after its last token: it was a 504 at `first_token_timeout`, which
    bounds a first token, where the same answer asked on /v1/completions waits `total_timeout`."""
    cfg = config(BackendConfig(name="llama", kind="llamacpp", urls=[llama_chat.url], models=[CHAT_MODEL],
                               first_token_timeout=0.5))
    body = {"prompt": "Once upon a time", "n_predict": 120, "ignore_eos": True}
    async with serve(cfg) as url, aiohttp.ClientSession() as http:
        async with http.post(url + "/completion", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["tokens_predicted"] == 120


async def test_llama_servers_own_routes_and_embeddings_are_under_the_keys_limits(llama_chat):
    """/completion, /infill and /rerank went around the per-key limits (a key refused on /v1/chat/completions kept
    getting answers there), as did embeddings; /slots is an admin's (another key's task, saving or erasing its
    cache)."""
    from proxy.limits import LimitsConfig
    cfg = config(BackendConfig(name="llama", kind="llamacpp", urls=[llama_chat.url], models=[CHAT_MODEL]),
                 server=ServerConfig(api_keys=["k1"], admin_keys=["root"]),
                 limits=LimitsConfig(requests_per_minute=2, request_burst=2))
    k1 = {"Authorization": "Bearer k1"}
    async with serve(cfg) as url, aiohttp.ClientSession(headers=k1) as http:
        async with http.post(url + "/completion", json={"prompt": "Hi", "n_predict": 1}) as resp:
            assert resp.status == 200
        async with http.post(url + "/v1/embeddings", json={"model": CHAT_MODEL, "input": "hi"}) as resp:
            assert resp.status in (200, 400)  # a chat-only server refuses embeddings: still a request
        async with http.post(url + "/completion", json={"prompt": "Hi", "n_predict": 1}) as resp:
            assert resp.status == 429 and resp.headers["Retry-After"] and (await resp.json())["error"]["type"] == \
                "rate_limit_error"
            assert resp.headers["x-ratelimit-remaining-requests"] == "0"
        async with http.post(url + "/api/embed", json={"model": CHAT_MODEL, "input": "hi"}) as resp:
            assert resp.status == 429 and "error" in await resp.json()
        async with http.get(url + "/slots") as resp:
            assert resp.status == 403
        async with http.get(url + "/props") as resp:  # state only: not a request against the limits
            assert resp.status == 200


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("prompts", [["Once upon a time"], ["Once upon a time", "The cat sat"]], ids=["one", "two"])
async def test_llama_servers_own_routes_are_charged_the_tokens_they_used(llama_chat, stream, prompts):
    """A key's tokens per minute held only the body's size of /completion (~27 tokens here): 120 written cost
    nothing; then, of an array of prompts, only the last result's tokens were charged."""
    from proxy.limits import LimitsConfig
    cfg = config(BackendConfig(name="llama", kind="llamacpp", urls=[llama_chat.url], models=[CHAT_MODEL]),
                 server=ServerConfig(api_keys=["k1"]), limits=LimitsConfig(tokens_per_minute=600))
    body = {"prompt": prompts if len(prompts) > 1 else prompts[0], "n_predict": 120, "ignore_eos": True,
            "temperature": 0, "stream": stream}
    async with serve(cfg) as url, aiohttp.ClientSession(headers={"Authorization": "Bearer k1"}) as http:
        async with http.post(url + "/completion", json=body) as resp:
            assert resp.status == 200
            before = int(resp.headers["x-ratelimit-remaining-tokens"])
            await resp.read()
        async with http.post(url + "/completion", json={**body, "n_predict": 1, "stream": False}) as resp:
            after = int(resp.headers["x-ratelimit-remaining-tokens"])
    # each prompt's 120 tokens and its own, less the first's estimate, and the second's estimate: ~124 a prompt; a
    # refill of 10 a second between the two admissions takes some back (2 s for two prompts)
    assert before - after > 124 * len(prompts) - 40


async def test_a_set_of_llama_servers_passes_on_their_own_routes_and_counts_exactly(llama_chat):
    """A backend with several urls had none of llama-server's own routes (a 404 "config.toml has none") and only
    an estimate for Anthropic's count_tokens."""
    cfg = config(BackendConfig(name="pool", kind="llamacpp", urls=[llama_chat.url, llama_chat.url],
                               models=[CHAT_MODEL]))
    async with serve(cfg) as url, aiohttp.ClientSession() as s:
        async with s.post(url + "/tokenize", json={"content": "hello world"}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["tokens"]
        async with s.post(url + "/v1/messages/count_tokens", json={
                "model": CHAT_MODEL, "messages": [{"role": "user", "content": "hello"}]}) as resp:
            assert resp.status == 200 and resp.headers["X-Velo-Token-Count"] == "exact"


async def test_ollama_total_duration_counts_the_wait_for_a_slot(velo_llama):
    """`total_duration` is Ollama's from arrival to the end (server/routes.go), queueing included: llama-server's
    timings cover the prompt and the answer only, and a request that waited for one of its 4 slots said it took
    its compute time alone."""
    _, oll = clients(velo_llama)

    async def timed(i: int) -> tuple[float, float]:  # each its own question: equal ones share one generation
        started = time.perf_counter()
        answer = await oll.chat(model=CHAT_MODEL, messages=[{"role": "user", "content": f"Tell story number {i}"}],
                                options={"num_predict": 64, "temperature": 0})
        return time.perf_counter() - started, answer.total_duration / 1e9

    walls, totals = zip(*await asyncio.gather(*(timed(i) for i in range(8))))
    assert max(walls) > 1.5 * min(walls), walls  # some waited for a slot
    # the clock starts once the body is read, as Ollama's handler's does: on a starved machine (a valgrind run
    # beside the suite) the time before it grew to 0.76 s of a 7.46 s wait; a total of the compute alone is ~half
    assert all(0 <= wall - total < 0.25 + 0.1 * wall for wall, total in zip(walls, totals)), (walls, totals)


async def test_open_webui_finds_and_chats_with_a_model_llama_server_names_without_a_tag(llama_chat):
    """Open WebUI keys its model table by /api/tags' `model`, and adds `:latest` to a name without a tag before it
    looks a chat's model up there (routers/ollama.py generate_chat_completion, get_ollama_url), as Ollama lists every
    name with its tag (types/model/name.go DisplayShortest). llama-server names its model by its file, with no tag:
    each chat with it was Open WebUI's own 400 "model not found", before any request reached Velo."""
    cfg = config(BackendConfig(name="llama", kind="llamacpp", urls=[llama_chat.url]))
    async with serve(cfg) as url, aiohttp.ClientSession() as http:
        async with http.get(url + "/api/tags") as resp:
            table = {m["model"]: m for m in (await resp.json())["models"]}
        [listed] = table
        asked = listed if ":" in listed else f"{listed}:latest"  # Open WebUI's own step
        assert asked in table and table[asked]["name"] == asked
        body = {"model": asked, "messages": HELLO, "stream": False, "options": {"num_predict": 4}}
        async with http.post(url + "/api/chat", json=body) as resp:
            assert resp.status == 200 and (await resp.json())["message"]["content"]
        async with http.get(url + "/api/ps") as resp:  # its expiry joined to /api/tags by name
            assert [m["name"] for m in (await resp.json())["models"]] == [asked]


async def test_continues_fill_in_the_middle_over_the_window_keeps_the_suffix_and_fits(velo_llama):
    """Continue's autocomplete sends prefix and suffix without `raw` (Ollama.ts _getGenerateOptions), which goes to
    /infill with both; the prompt was counted as a chat of the prefix alone, trimmed to fit without the suffix, and
    llama-server refused the rest: every completion near a long file's end was a 400 "the prompt is 724 tokens, more
    than the context window of 512 tokens". Ollama trims such a prompt's start and answers."""
    _, oll = clients(velo_llama)
    prefix, suffix = "".join(f"x{i} = {i}\n" for i in range(200)), "\nprint(x1)\n" * 40
    out = await oll.generate(model=CHAT_MODEL, prompt=prefix, suffix=suffix, keep_alive=1800,
                             options={"num_predict": 4, "temperature": 0, "num_ctx": 512, "stop": ["\n\n"]})
    assert out.done and out.prompt_eval_count <= 512


async def test_logprobs_with_tools_in_one_answer(velo_llama):
    """llama-server refuses logprobs with tools on a stream, which it answers whole; Velo asked every chat streamed,
    so a one-answer chat with both was a 400, "logprobs is not supported with tools + stream"."""
    oai, _ = clients(velo_llama)
    out = await oai.chat.completions.create(model=CHAT_MODEL, messages=HELLO, tools=[WEATHER], logprobs=True,
                                            top_logprobs=2, max_tokens=6, temperature=0)
    tokens = out.choices[0].logprobs.content
    assert tokens and all(len(t.top_logprobs) == 2 for t in tokens) and out.usage.completion_tokens == 6
