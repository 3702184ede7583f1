"""The resolve stage: what the backend is asked when a request leaves sampling options unset, in every dialect, under
a model's [models] options and a preset's parameters, and with a backend that fills in its own defaults."""
from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.protocol import SamplingOptions
from proxy.app import make_app
from proxy.config import Config, ModelConfig
from tests.scripted import ScriptedBackend

USER = [{"role": "user", "content": "hi"}]
BODIES = {  # the same question with no sampling option set, as each dialect's clients send it
    "ollama": ("/api/chat", {"model": "tiny", "messages": USER, "stream": False}),
    "openai": ("/v1/chat/completions", {"model": "tiny", "messages": USER}),
    "anthropic": ("/v1/messages", {"model": "tiny", "messages": USER, "max_tokens": 9}),
    "responses": ("/v1/responses", {"model": "tiny", "input": "hi"}),
}
KNOBS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n")
OLLAMA = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "min_p": 0.0, "repeat_penalty": 1.1, "repeat_last_n": 64}
OPENAI = {"temperature": 1.0, "top_p": 1.0, "top_k": None, "min_p": None, "repeat_penalty": None,
          "repeat_last_n": None}


@pytest.fixture
async def velo():
    clients: list[TestClient] = []

    async def start(config: Config | None = None, own_defaults: str | None = None):
        backend = ScriptedBackend()
        backend.own_defaults = own_defaults
        client = TestClient(TestServer(make_app(config or Config(), {"s": backend})))
        await client.start_server()
        clients.append(client)
        return client, backend
    yield start
    for c in clients:
        await c.close()


async def asked(client: TestClient, backend: ScriptedBackend, dialect: str, **extra) -> SamplingOptions:
    path, body = BODIES[dialect]
    resp = await client.post(path, json={**body, **extra})
    assert resp.status == 200, await resp.text()
    return backend.requests[-1].options


def knobs(opts: SamplingOptions) -> dict:
    return {k: getattr(opts, k) for k in KNOBS}


@pytest.mark.parametrize("dialect, expected", [
    ("ollama", OLLAMA), ("openai", OPENAI), ("responses", OPENAI),
    ("anthropic", {**OPENAI, "temperature": 1.0, "top_p": None})])
async def test_each_dialect_gets_its_own_servers_defaults(velo, dialect, expected):
    client, backend = await velo()
    assert knobs(await asked(client, backend, dialect)) == expected


async def test_what_the_request_sets_stays(velo):
    client, backend = await velo()
    opts = await asked(client, backend, "ollama", options={"temperature": 0, "top_k": 5, "stop": ["x"]})
    assert knobs(opts) == {**OLLAMA, "temperature": 0.0, "top_k": 5} and opts.stop == ["x"]


async def test_a_models_options_come_before_the_defaults_and_after_the_request(velo):
    config = Config(models={"tiny:latest": ModelConfig({"temperature": 0.3, "repeat_penalty": 1.3})})
    client, backend = await velo(config)
    assert knobs(await asked(client, backend, "ollama")) == {**OLLAMA, "temperature": 0.3, "repeat_penalty": 1.3}
    assert knobs(await asked(client, backend, "openai", temperature=0.5)) == {**OPENAI, "temperature": 0.5,
                                                                            "repeat_penalty": 1.3}


async def test_an_aliases_options_apply_under_either_spelling(velo):
    """Ollama names every model with a tag: `fast:latest` is `fast`, the alias and its [models] table (before, the
    alias was a 404 and its table missed)."""
    config = Config(aliases={"fast": "tiny"}, models={"fast": ModelConfig({"temperature": 0.3})})
    client, backend = await velo(config)
    for name in ("fast", "fast:latest"):
        assert (await asked(client, backend, "ollama", model=name)).temperature == 0.3


async def test_a_backend_that_applies_the_dialects_defaults_itself_gets_none_twice(velo):
    """Ollama fills in its own defaults for /api/chat; an OpenAI request through it still gets OpenAI's, as
    Ollama's own /v1 sends them; a model's options still apply."""
    config = Config(models={"tiny": ModelConfig({"repeat_penalty": 1.2})})
    client, backend = await velo(config, own_defaults="ollama")
    assert knobs(await asked(client, backend, "ollama")) == {k: None for k in KNOBS} | {"repeat_penalty": 1.2}
    assert knobs(await asked(client, backend, "openai")) == {**OPENAI, "repeat_penalty": 1.2}


async def test_a_preset_applies_its_system_prompt_and_parameters_in_every_dialect(velo):
    config = Config(models={"tiny": ModelConfig({"temperature": 0.3, "top_k": 7})})
    client, backend = await velo(config)
    created = await client.post("/api/create", json={
        "model": "mario", "from": "tiny", "system": "You are Mario.", "stream": False,
        "parameters": {"temperature": 0.2, "stop": ["END"], "mirostat": 2}})
    assert created.status == 200 and await created.json() == {"status": "success"}
    for dialect in BODIES:
        path, body = BODIES[dialect]
        assert (await client.post(path, json={**body, "model": "mario"})).status == 200
        req = backend.requests[-1]
        assert req.model == "tiny:latest" and req.messages[0].role == "system"
        assert req.messages[0].content == "You are Mario."
        # the preset's parameters, then the model's options, then the dialect's defaults
        assert (req.options.temperature, req.options.top_k, req.options.stop) == (0.2, 7, ["END"])
        assert req.options.extra == {"mirostat": 2}
    await client.post("/api/chat", json={"model": "mario", "stream": False, "messages": [
        {"role": "system", "content": "Be Luigi."}, *USER]})
    assert [m.content for m in backend.requests[-1].messages] == ["Be Luigi.", "hi"]  # its own system prompt wins


async def test_a_presets_system_and_template_reach_generate_unless_raw(velo):
    client, backend = await velo()
    await client.post("/api/create", json={"model": "m", "from": "tiny", "system": "S", "template": "{{ .Prompt }}",
                                           "stream": False})
    await client.post("/api/generate", json={"model": "m", "prompt": "p", "stream": False})
    assert (backend.requests[-1].system, backend.requests[-1].template) == ("S", "{{ .Prompt }}")
    await client.post("/api/generate", json={"model": "m", "prompt": "p", "stream": False, "raw": True})
    assert (backend.requests[-1].system, backend.requests[-1].template) == (None, None)
