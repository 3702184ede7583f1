"""Real clients (`ollama`, `openai`) -> Velo -> a real llama-server in router mode (`--models-dir`): many models,
each loaded on demand in a server of its own and picked by each request's `model`. Two names for the shipped
SmolLM2-135M file make the directory's two models."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from adapters.base import BackendConfig
from tests.integration.conftest import clients, config, serve
from tests.llama_server import LlamaServer, model_path

NAMES = ("alpha", "beta")


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[LlamaServer]:
    for name in NAMES:
        os.symlink(model_path(), tmp_path / f"{name}.gguf")
    server = LlamaServer(["-c", "1024", "-np", "1", "-t", "1", "-tb", "1"], models_dir=str(tmp_path))
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        server.stop()


async def states(server: LlamaServer) -> dict[str, str]:
    async with aiohttp.ClientSession() as s, s.get(server.url + "/v1/models") as resp:
        return {e["id"]: e["status"]["value"] for e in (await resp.json())["data"]}


async def test_a_router_lists_and_shows_its_models_without_loading_them(router):
    """Listing and showing read each model's file (asking the router for a model's /props would load it)."""
    async with serve(config(BackendConfig(name="r", kind="llamacpp", urls=[router.url]))) as url:
        _, oll = clients(url)
        assert sorted(m.model for m in (await oll.list()).models) == [f"{n}:latest" for n in NAMES]  # Ollama's way
        shown = await oll.show("beta")
        assert shown.capabilities == ["completion", "tools"]  # SmolLM2's vocabulary has no FIM tokens
        assert "<|im_start|>" in shown.template and "num_ctx" in shown.parameters and "1024" in shown.parameters
        assert "{{- if .Tools }}" in shown.template  # as Ollama's templates offer tools (LiteLLM reads it)
        assert shown.modelinfo["general.architecture"] == "llama"
        assert await states(router) == {"alpha": "unloaded", "beta": "unloaded"}
        assert (await oll.ps()).models == []


async def test_a_router_answers_each_dialect_and_unloads_on_keep_alive_0(router):
    """Every request names its model to the router (/completion, /infill, /tokenize and /apply-template included,
    which a single-model server needs no name for); Ollama's keep_alive 0 unloads it there."""
    async with serve(config(BackendConfig(name="r", kind="llamacpp", urls=[router.url]))) as url:
        oai, oll = clients(url)
        chat = await oll.chat(model="beta", messages=[{"role": "user", "content": "Say hello"}],
                              options={"num_predict": 4, "temperature": 0})
        assert chat.message.content and chat.done_reason == "length"
        generated = await oll.generate(model="beta", prompt="Say hello", options={"num_predict": 4})  # rendered
        assert generated.response and generated.context
        completion = await oai.completions.create(model="beta", prompt="Once upon a time", max_tokens=4)
        assert completion.choices[0].text and completion.usage.completion_tokens == 4
        assert await states(router) == {"alpha": "unloaded", "beta": "loaded"}
        assert [m.model for m in (await oll.ps()).models] == ["beta:latest"]
        await oll.generate(model="beta", keep_alive=0)
        for _ in range(100):  # the router stops the model's server after it answered
            if (await states(router))["beta"] == "unloaded":
                break
            await asyncio.sleep(0.1)
        assert await states(router) == {"alpha": "unloaded", "beta": "unloaded"}


async def test_ollamas_bare_load_request_loads_a_routers_model(router):
    """Ollama's load request (a chat with no messages) loads the model there and answers once it has."""
    async with serve(config(BackendConfig(name="r", kind="llamacpp", urls=[router.url]))) as url:
        _, oll = clients(url)
        loaded = await oll.chat(model="alpha", messages=[])
        assert loaded.done_reason == "load" and loaded.load_duration > 0
        assert await states(router) == {"alpha": "loaded", "beta": "unloaded"}
        again = await oll.chat(model="alpha", messages=[])  # already loaded: answered after one look
        assert again.done_reason == "load" and again.load_duration < loaded.load_duration



async def test_a_native_route_names_the_model_as_the_router_knows_it(router):
    """llama-server's own routes went on with the client's name: an alias (or a preset) was unknown to the router."""
    async with serve(config(BackendConfig(name="r", kind="llamacpp", urls=[router.url]),
                            aliases={"fast": "r:alpha"})) as url:
        async with aiohttp.ClientSession() as s, s.post(url + "/tokenize", json={"model": "fast",
                                                                                "content": "hello"}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["tokens"]
        async with aiohttp.ClientSession() as s, s.get(url + "/props?model=fast") as resp:  # a GET names it so
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["model_path"].endswith("alpha.gguf")
