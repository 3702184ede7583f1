"""Real clients -> Velo -> the Ollama protocol double (tests/fakes.py; Ollama itself cannot run here).

The `ollama` client sees what it would see from Ollama; an OpenAI client's request reaches Ollama's native API
with its sampling settings turned into Ollama `options`."""
import pytest

from adapters.base import BackendConfig
from tests.integration.conftest import clients, config, serve

MODEL = "smollm2:135m"


@pytest.fixture
async def velo(ollama_double):
    async with serve(config(BackendConfig(name="ollama", kind="ollama", urls=[ollama_double.url]))) as url:
        yield url


async def test_ollama_client_chat_generate_embed(velo, ollama_double):
    _, oll = clients(velo)
    ollama_double.script.reply = "Hello big world"
    parts = [p async for p in await oll.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
                                            options={"num_ctx": 1024, "mirostat": 2}, keep_alive="5m")]
    assert "".join(p.message.content for p in parts) == "Hello big world" and parts[-1].done_reason == "stop"
    assert parts[-1].eval_count == 3 and parts[-1].prompt_eval_count == 1
    sent = ollama_double.last("/api/chat")
    # num_predict: Velo's [server] default_max_tokens for a request that sets no output limit
    assert sent["options"] == {"num_ctx": 1024, "mirostat": 2, "num_predict": 4096} and sent["keep_alive"] == "5m"

    gen = await oll.generate(model=MODEL, prompt="def f():", suffix="\n", raw=True, options={"num_predict": 2})
    assert gen.response == "Hello big" and gen.done_reason == "length"
    assert ollama_double.last("/api/generate")["suffix"] == "\n"

    emb = await oll.embed(model=MODEL, input=["a", "b c"], dimensions=4)
    assert [len(e) for e in emb.embeddings] == [4, 4] and emb.prompt_eval_count == 3


async def test_ollama_client_tools_and_model_management(velo, ollama_double):
    _, oll = clients(velo)
    ollama_double.script.reply = ""
    ollama_double.script.tool_calls = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    resp = await oll.chat(model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
                          tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {
                              "type": "object", "properties": {"city": {"type": "string"}}}}}])
    assert [(c.function.name, dict(c.function.arguments)) for c in resp.message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]

    assert {m.model for m in (await oll.list()).models} == set(ollama_double.models)
    shown = await oll.show(MODEL)
    assert shown.modelinfo["llama.context_length"] == 8192 and "insert" in shown.capabilities
    assert [m.model for m in (await oll.ps()).models] == list(ollama_double.models)
    statuses = [s.status async for s in await oll.pull("qwen:0.5b", stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "qwen:0.5b" in ollama_double.models
    await oll.delete("qwen:0.5b")
    assert "qwen:0.5b" not in ollama_double.models


async def test_openai_client_options_survive_to_ollama(velo, ollama_double):
    oai, _ = clients(velo)
    ollama_double.script.reply = "one two three four"
    resp = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "count"}], max_tokens=2, temperature=0.3, top_p=0.9,
        seed=11, stop=["five"], presence_penalty=0.1, frequency_penalty=0.2,
        extra_body={"top_k": 7, "min_p": 0.05, "repetition_penalty": 1.15})
    assert resp.choices[0].message.content == "one two" and resp.choices[0].finish_reason == "length"
    assert ollama_double.last("/api/chat")["options"] == {
        "num_predict": 2, "temperature": 0.3, "top_p": 0.9, "seed": 11, "stop": ["five"], "presence_penalty": 0.1,
        "frequency_penalty": 0.2, "top_k": 7, "min_p": 0.05, "repeat_penalty": 1.15}
    assert not [r for r in ollama_double.requests if r.path.startswith("/v1/")]  # native API only

    comp = await oai.completions.create(model=MODEL, prompt="def f():", suffix="\n", max_tokens=3)
    assert comp.choices[0].text == "one two three"
    sent = ollama_double.last("/api/generate")
    assert sent["suffix"] == "\n" and sent["options"]["num_predict"] == 3
    assert "raw" not in sent  # in raw mode Ollama drops the suffix: only the model's template builds the middle


async def test_presets_over_ollama_are_velos_and_ollamas_defaults_are_not_doubled(velo, ollama_double, tmp_path):
    """A create from a model stays in Velo (the double never sees it); a chat on the preset reaches Ollama as its
    base model with the preset's system prompt and parameters, and no Ollama defaults that Ollama applies itself;
    a create from files is Ollama's to do, its file uploaded there first."""
    oai, oll = clients(velo)
    await oll.create("mario", from_=MODEL, system="You are Mario.", parameters={"temperature": 0.2})
    assert not [r for r in ollama_double.requests if r.path == "/api/create"]
    assert "mario:latest" in {m.model for m in (await oll.list()).models}

    await oll.chat("mario", messages=[{"role": "user", "content": "hi"}])
    sent = ollama_double.last("/api/chat")
    assert sent["model"] == MODEL and sent["messages"][0] == {"role": "system", "content": "You are Mario."}
    assert sent["options"] == {"temperature": 0.2, "num_predict": 4096}

    await oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert ollama_double.last("/api/chat")["options"] == {"temperature": 1.0, "top_p": 1.0, "num_predict": 4096}

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    digest = await oll.create_blob(gguf)
    statuses = [s.status async for s in await oll.create("from-file", files={"m.gguf": digest}, stream=True)]
    assert statuses[-1] == "success" and ollama_double.last("/api/create")["model"] == "from-file"
