"""`velo serve` with the engine on CUDA, through the OpenAI and the Anthropic dialects, whole and streamed.
Skipped without CUDA: it runs on the lent GPU machine (bench/gpu_check.sh), never in CI."""
from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
import torch

from tests.engine.tiny import write_tiny_model
from tests.velo_serve import velo_serve

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the lent GPU machine)")


@pytest.fixture(scope="module")
def velo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cuda_serve")
    model = write_tiny_model(str(folder / "tiny"), "qwen2")
    with velo_serve(folder, f"""
[[backends]]
name = "engine"
kind = "engine"
options = {{ model = "{model}", name = "tiny", device = "cuda", progress = false, kv_memory = 0.05 }}
""") as url:
        yield url


def post(url: str, body: dict) -> tuple[int, bytes]:
    """Synchronous, so the test needs no asyncio plugin on the GPU machine."""
    async def call():
        async with aiohttp.ClientSession() as s, s.post(url, json=body, headers={"Cache-Control": "no-cache"}) as r:
            return r.status, await r.read()
    return asyncio.run(call())


def test_openai_and_anthropic_answer_alike_from_the_gpu(velo):
    user = [{"role": "user", "content": "hello there"}]
    status, raw = post(velo + "/v1/chat/completions", {"model": "tiny", "messages": user, "temperature": 0,
                                                              "max_tokens": 12})
    assert status == 200, raw
    chat = orjson.loads(raw)["choices"][0]["message"]["content"]
    status, raw = post(velo + "/v1/messages", {"model": "tiny", "messages": user, "temperature": 0,
                                                      "max_tokens": 12})
    assert status == 200, raw
    assert orjson.loads(raw)["content"][0]["text"] == chat and chat


def test_streams_from_the_gpu_end_as_each_dialect_ends(velo):
    user = [{"role": "user", "content": "count"}]
    status, raw = post(velo + "/v1/chat/completions", {"model": "tiny", "messages": user, "max_tokens": 8,
                                                              "stream": True})
    assert status == 200 and raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]
    status, raw = post(velo + "/v1/messages", {"model": "tiny", "messages": user, "max_tokens": 8,
                                                      "stream": True})
    assert status == 200 and b"event: message_stop" in raw, raw[-200:]
