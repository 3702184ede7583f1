"""The Ollama model surface (/api/show, /api/ps, keep_alive, context, template, embeddings) on each backend kind,
through the real `ollama` client: Velo's engine (a tiny random model, real weights not needed for the shape), the
real llama-server, the Ollama protocol double (tests/fakes.py) and an OpenAI-compatible server (FakeOpenAI)."""
import asyncio
import json
import math
import time

import aiohttp
import ollama
import pytest
from aiohttp.test_utils import TestServer

from adapters.base import BackendConfig
from adapters.engine import EngineBackend
from proxy.app import make_app
from tests.engine.tiny import engine_options, write_tiny_model
from tests.integration.conftest import CHAT_MODEL, EMBED_MODEL, clients, config, serve
from tests.llama_server import model_path

TINY = "tiny"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny")), "qwen2")


@pytest.fixture
async def velo_engine(model_dir):
    engine = EngineBackend(BackendConfig(name="engine", kind="engine", options=engine_options(model_dir)))
    server = TestServer(make_app(config(), {"engine": engine}), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), engine
    finally:
        await server.close()


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def _parameters(text: str) -> list[tuple[str, str]]:
    """As Continue reads them: `key value` lines."""
    return [tuple(line.split(None, 1)) for line in text.splitlines()]


async def test_engine_show(velo_engine, model_dir):
    url, _ = velo_engine
    _, c = clients(url)
    shown = await c.show(TINY)
    assert _parameters(shown.parameters) == [("num_ctx", "512"), ("stop", '"<|im_start|>"'), ("stop", '"<|im_end|>"')]
    assert "{{- range .Messages }}<|im_start|>" in shown.template and "{%" not in shown.template
    # tools as the capabilities say (LiteLLM, so Open Interpreter, reads the template; it ran SmolLM2 in text mode)
    assert "tools" in shown.capabilities and shown.template.startswith("{{- if .Tools }}")
    assert ("{{ .Suffix }}" in shown.template) == ("insert" in shown.capabilities)  # FIM only where it works
    assert shown.capabilities[:2] == ["completion", "tools"] and "embedding" not in shown.capabilities
    info = shown.modelinfo
    assert info["general.architecture"] == "qwen2" and info["qwen2.context_length"] == 512
    assert {"general.parameter_count", "qwen2.embedding_length", "qwen2.block_count", "qwen2.attention.head_count",
            "qwen2.attention.head_count_kv"} <= info.keys()
    assert all(isinstance(v, (int, float, str, bool)) for v in info.values())
    raw = await _post(url, "/api/show", {"model": TINY})
    # the model's file is named once, where Ollama names its blob (the Modelfile's FROM); nowhere else
    assert f"\nFROM {model_dir}" in raw.pop("modelfile") and model_dir not in json.dumps(raw)


async def _post(url: str, path: str, body: dict) -> dict:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_engine_keep_alive_zero_unloads_and_the_next_request_loads(velo_engine):
    url, engine = velo_engine
    _, c = clients(url)
    first = await c.generate(model=TINY, prompt="hi", options={"num_predict": 2})
    assert first.load_duration is None  # loaded at start-up: this request waited for nothing, and says none
    [running] = (await c.ps()).models
    assert running.context_length == 512 and running.expires_at.year < 2300  # last request's default 5 minutes
    assert (await c.generate(model=TINY, prompt="", keep_alive=0)).done_reason == "unload"
    assert engine.engine is None and (await c.ps()).models == []
    assert [m.model for m in (await c.list()).models] == [f"{TINY}:latest"]  # listing does not load it again
    again = await c.generate(model=TINY, prompt="hi", options={"num_predict": 2}, keep_alive="1h")
    assert engine.engine is not None and 0 < again.load_duration <= again.total_duration
    [running] = (await c.ps()).models
    assert running.expires_at.timestamp() - time.time() > 3500
    emb = await c.embed(model=TINY, input="x")
    assert emb.load_duration is None and emb.total_duration > 0  # no load: none, as Ollama's omitempty leaves it
    assert (await c.chat(model=TINY, messages=[], keep_alive=0)).done_reason == "unload"
    loaded = await c.chat(model=TINY, messages=[])
    assert loaded.done_reason == "load" and loaded.load_duration > 0 and engine.engine is not None


async def test_a_name_the_engine_does_not_serve_never_unloads_it(velo_engine):
    """A request for another name is Ollama's 404. Its stay running out, or its `keep_alive: 0`, shut the engine
    down under whatever ran then (an AI SDK error test, a picker's probe): a 502 five minutes after the typo."""
    url, engine = velo_engine
    _, c = clients(url)
    for ask in (c.chat(model="bogus:1b", messages=[{"role": "user", "content": "hi"}], keep_alive="1s"),
                c.generate(model="bogus:1b", prompt="", keep_alive=0)):
        with pytest.raises(ollama.ResponseError) as e:
            await ask
        assert e.value.status_code == 404
    await asyncio.sleep(1.5)  # past the first request's stay
    assert engine.engine is not None
    assert (await c.generate(model=TINY, prompt="hi", options={"num_predict": 2})).load_duration is None


async def test_engine_generate_context_and_template(velo_engine):
    url, _ = velo_engine
    _, c = clients(url)
    first = await c.generate(model=TINY, prompt="hello", options={"num_predict": 3, "temperature": 0})
    assert first.context and all(isinstance(t, int) for t in first.context)
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    second = await c.generate(model=TINY, prompt="more", context=first.context, options={"num_predict": 3})
    assert second.prompt_eval_count > len(first.context) and second.context[:len(first.context)] == first.context
    raw = await c.generate(model=TINY, prompt="a b c", raw=True, options={"num_predict": 1})
    assert raw.context is None  # Ollama sends no context for raw requests
    templated = await c.generate(model=TINY, prompt="a b c", template="{{ .Prompt }}", options={"num_predict": 1})
    assert templated.prompt_eval_count == raw.prompt_eval_count  # the template replaced the chat template
    with pytest.raises(ollama.ResponseError) as e:
        await c.generate(model=TINY, prompt="x", context=[10**9])
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:  # the tiny model's vocabulary has no FIM tokens
        await c.generate(model=TINY, prompt="def f(", suffix="pass", raw=True)
    assert (e.value.status_code, e.value.error) == (400, '"tiny" does not support insert')
    with pytest.raises(ollama.ResponseError) as e:  # a raw prompt has no room for a note
        await c.generate(model=TINY, prompt="x", images=[b"\x89PNG"])
    assert (e.value.status_code, e.value.error) == (400, '"tiny" does not support vision')
    chat = [{"role": "user", "content": "x"}]
    seen = await c.chat(model=TINY, messages=[{**chat[0], "images": [b"\x89PNG"]}], options={"num_predict": 1})
    plain = await c.chat(model=TINY, messages=chat, options={"num_predict": 1})
    assert seen.prompt_eval_count > plain.prompt_eval_count  # a note took the image's place, as in the agents' APIs


async def test_engine_embeddings_legacy_and_dimensions(velo_engine):
    url, _ = velo_engine
    _, c = clients(url)
    legacy = await c.embeddings(model=TINY, prompt="hello there")
    assert abs(_norm(legacy.embedding) - 1) > 1e-3  # not normalised, as Ollama's legacy route
    assert list((await c.embeddings(model=TINY, prompt="")).embedding) == []
    full = (await c.embed(model=TINY, input="hello there")).embeddings[0]
    short = (await c.embed(model=TINY, input="hello there", dimensions=8)).embeddings[0]
    assert len(short) == 8 and abs(_norm(short) - 1) < 1e-6
    scale = _norm(full[:8])
    assert all(abs(s - f / scale) < 1e-6 for s, f in zip(short, full[:8]))


async def test_llama_server_show_context_template_and_embeddings(velo_llama):
    _, c = clients(velo_llama)
    shown = await c.show(CHAT_MODEL)
    assert _parameters(shown.parameters)[0] == ("num_ctx", "512")  # per slot: -c 2048 over 4 slots
    assert "{{ .Suffix }}" in shown.template and "insert" in shown.capabilities  # /infill works (FIM overrides)
    assert shown.modelinfo["llama.block_count"] == 30 and shown.modelinfo["llama.attention.head_count"] == 9
    assert shown.modelinfo["general.parameter_count"] == 134_515_008
    assert f"\nFROM {model_path()}\n" in shown.modelfile  # the file the server runs, as Ollama names its blob
    first = await c.generate(model=CHAT_MODEL, prompt="Say hi", options={"num_predict": 3, "temperature": 0})
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    streamed = [p async for p in await c.generate(model=CHAT_MODEL, prompt="Say hi", stream=True,
                                                  options={"num_predict": 3, "temperature": 0})]
    assert streamed[-1].context == first.context and all(p.context is None for p in streamed[:-1])
    second = await c.generate(model=CHAT_MODEL, prompt="again", context=first.context, options={"num_predict": 2})
    assert second.context[:len(first.context)] == first.context
    templated = await c.generate(model=CHAT_MODEL, prompt="a b c", template="{{ .Prompt }}",
                                 options={"num_predict": 1})
    raw = await c.generate(model=CHAT_MODEL, prompt="a b c", raw=True, options={"num_predict": 1})
    assert templated.prompt_eval_count == raw.prompt_eval_count
    legacy = await c.embeddings(model=EMBED_MODEL, prompt="hello there")
    assert abs(_norm(legacy.embedding) - 1) > 1e-3
    short = (await c.embed(model=EMBED_MODEL, input="hello there", dimensions=16)).embeddings[0]
    assert len(short) == 16 and abs(_norm(short) - 1) < 1e-6


async def test_ollama_backend_passes_show_unload_and_pull_through(ollama_double):
    async with serve(config(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url]))) as url:
        _, c = clients(url)
        shown = await c.show("smollm2:135m")
        assert shown.parameters == 'stop                           "<|im_end|>"'  # Ollama's own, untouched
        assert shown.modelinfo["llama.embedding_length"] == 576 and "insert" in shown.capabilities
        [running, _] = (await c.ps()).models
        assert running.context_length == 8192 and running.expires_at.year == 2099  # Ollama's own expiry
        assert (await c.chat(model="smollm2:135m", messages=[], keep_alive=0)).done_reason == "unload"
        assert ollama_double.last("/api/generate") == {"model": "smollm2:135m", "keep_alive": 0}
        await c.generate(model="smollm2:135m", prompt="", keep_alive="10m")
        assert ollama_double.last("/api/generate") == {"model": "smollm2:135m", "keep_alive": "10m"}
        await c.embeddings(model="smollm2:135m", prompt="x")
        assert ollama_double.last("/api/embeddings")["prompt"] == "x"  # the legacy route, not normalised by Velo
        progress = [p async for p in await c.pull("qwen2.5-coder:0.5b", stream=True)]
        assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
        assert progress[1].total == 2142590208


async def test_tags_from_an_ollama_that_lists_no_capabilities_claim_none(ollama_double):
    """Ollama's /api/tags lists capabilities only since v0.30.0; for an older one (the double) Velo assumed
    "completion" and listed every model, an embedding model too, as `["completion", "tools"]`."""
    ollama_double.models["all-minilm:latest"].capabilities = ["embedding"]
    async with serve(config(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url]))) as url:
        _, c = clients(url)
        async with aiohttp.ClientSession() as s, s.get(url + "/api/tags") as resp:
            assert [m.get("capabilities") for m in (await resp.json())["models"]] == [None, None]
        assert (await c.show("all-minilm")).capabilities == ["embedding"]
        assert (await c.show(CHAT_MODEL)).capabilities == ["completion", "tools", "insert"]


async def test_show_passes_an_ollama_models_license_text_on(ollama_double):
    """`ollama show --license` prints ShowResponse.license, Ollama's LICENSE layer; Velo dropped an Ollama backend's
    and showed the GGUF's `general.license` name in its place, or no license at all."""
    ollama_double.models[CHAT_MODEL].license = "Apache License\nVersion 2.0, January 2004"
    async with serve(config(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url]))) as url:
        _, c = clients(url)
        assert (await c.show(CHAT_MODEL)).license == "Apache License\nVersion 2.0, January 2004"
        assert (await c.show("all-minilm")).license is None


async def test_show_passes_an_ollama_backends_other_show_fields_on(ollama_double):
    """ShowResponse's messages (`ollama run` prints a Modelfile's MESSAGE lines), projector_info (a vision model's;
    clients read clip.has_vision_encoder there), tensors, renderer, parser, requires and a cloud model's remote_model
    and remote_host: Velo dropped every one, and asked no `verbose`, so tokenizer.ggml.tokens stayed []. The `ollama`
    client's ShowResponse (0.6.3) has none of these fields and its show() sends no `verbose`: asked raw here."""
    chat, embed = ollama_double.models[CHAT_MODEL], ollama_double.models["all-minilm:latest"]
    chat.messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    chat.projector_info = {"clip.has_vision_encoder": True, "clip.vision.image_mean": [0.5] * 6}
    chat.renderer = chat.parser = "qwen3-coder"
    chat.requires = "0.12.0"
    embed.remote_model, embed.remote_host = "all-minilm:cloud", "https://ollama.com:443"
    async with serve(config(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url]))) as url, \
            aiohttp.ClientSession() as s:
        async def show(model: str, **more: bool) -> dict:
            async with s.post(url + "/api/show", json={"model": model, **more}) as resp:
                return await resp.json()

        async def straight(model: str, **more: bool) -> dict:
            async with s.post(ollama_double.url + "/api/show", json={"model": model, **more}) as resp:
                return await resp.json()

        keys = ("messages", "projector_info", "tensors", "renderer", "parser", "requires", "remote_model",
                "remote_host")
        for model, more in ((CHAT_MODEL, {}), (CHAT_MODEL, {"verbose": True}), ("all-minilm:latest", {})):
            ollamas, velos = await straight(model, **more), await show(model, **more)
            assert {k: velos.get(k) for k in keys} == {k: ollamas.get(k) for k in keys}
            assert [k for k in keys if k in velos] == [k for k in keys if k in ollamas]  # omitempty, as Ollama
        short, verbose = await show(CHAT_MODEL), await show(CHAT_MODEL, verbose=True)
        assert short["model_info"]["tokenizer.ggml.tokens"] == [] and short["projector_info"] == {
            "clip.has_vision_encoder": True, "clip.vision.image_mean": []}
        assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) == 6
        assert verbose["projector_info"]["clip.vision.image_mean"] == [0.5] * 6
        assert "tensors" not in await show("all-minilm") and "messages" not in await show("all-minilm")


async def test_legacy_embeddings_with_no_prompt_loads_or_unloads_as_ollama_does(ollama_double):
    """EmbeddingsHandler loads the model for an empty prompt ("an empty request loads the model"), under its
    keep_alive, so 0 unloads it; Velo only looked the name up, so the model stayed loaded, or was not loaded."""
    async with serve(config(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url]))) as url:
        _, c = clients(url)
        assert list((await c.embeddings(model="smollm2:135m", prompt="", keep_alive=0)).embedding) == []
        assert ollama_double.last("/api/generate") == {"model": "smollm2:135m", "keep_alive": 0}
        assert list((await c.embeddings(model="smollm2:135m", prompt="", keep_alive="10m")).embedding) == []
        assert ollama_double.last("/api/generate") == {"model": "smollm2:135m", "keep_alive": "10m"}
        assert not [r for r in ollama_double.requests if r.path.startswith("/api/embed")]


async def test_openai_backend_show_says_what_it_can(openai_fake):
    async with serve(config(BackendConfig(name="oai", kind="openai", urls=[openai_fake.url]))) as url:
        _, c = clients(url)
        shown = await c.show("fake-gpt")
        assert shown.template == "{{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}" and shown.parameters is None
        assert shown.capabilities == ["completion", "tools", "thinking"]
        with pytest.raises(ollama.ResponseError) as e:
            await c.pull("fake-gpt2")
        assert e.value.status_code == 400 and "config.toml" in e.value.error


async def test_a_bare_unload_reaches_ollama_while_velo_streams_from_the_model(ollama_double):
    """A bare `keep_alive: 0` while a request streams from the model unloads it once the request is done (as Ollama
    does, server/sched.go expireRunner); Velo held the unload back for the request in flight and then, the backend
    being one that unloads for itself, never sent it: the model stayed loaded for the streaming request's
    keep_alive."""
    ollama_double.script.token_delay = 0.05
    async with serve(config(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url]))) as url:
        _, c = clients(url)
        stream = await c.chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
        first = await anext(stream)
        assert (await c.chat(model=CHAT_MODEL, messages=[], keep_alive=0)).done_reason == "unload"
        assert first.message.content + "".join([p.message.content async for p in stream]) == ollama_double.script.reply
        for _ in range(50):
            if any(r.path == "/api/generate" for r in ollama_double.requests):
                break
            await asyncio.sleep(0.02)
        assert ollama_double.last("/api/generate") == {"model": CHAT_MODEL, "keep_alive": 0}



async def test_keep_alive_zero_answered_from_the_cache_still_unloads_the_ollama_model(ollama_double):
    """A cache hit never reaches the backend, so its `keep_alive: 0` did not either and the model stayed loaded;
    the answer still comes from the cache."""
    cfg = config(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url]))
    cfg.cache.enabled = True
    unload = {"model": CHAT_MODEL, "keep_alive": 0}

    async def unloads(wanted: int) -> int:
        for _ in range(50):
            if (sent := sum(r.body == unload for r in ollama_double.requests)) >= wanted:
                break
            await asyncio.sleep(0.02)
        return sent
    async with serve(cfg) as url:
        _, c = clients(url)
        chat = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "options": {"temperature": 0}}
        generate = {"model": CHAT_MODEL, "prompt": "hi", "options": {"temperature": 0}}
        for call, asked in ((c.chat, chat), (c.generate, generate)):
            await call(**asked, keep_alive="10m")
            for keep in (0, "0s"):
                before = await unloads(0)
                assert (await call(**asked, keep_alive=keep)).done_reason == "stop"
                assert await unloads(before + 1) == before + 1
        assert await unloads(5) == 4
        assert len([r for r in ollama_double.requests if r.path in ("/api/chat", "/api/generate")]) == 2 + 4
