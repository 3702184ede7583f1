"""The cache stage's key: under the backend, the model that answers and its digest, which no two configurations or
two builds of a model share."""
from __future__ import annotations

import asyncio

from adapters.protocol import ChatRequest, Message, ModelInfo
from proxy.cache.keys import exact_key
from proxy.job import Job
from proxy.router import Target
from proxy.stages.cache import _keyed
from proxy.state import GENERATIONS
from tests.scripted import ScriptedBackend


def _key(backend: str, model: str, digest: str = "") -> str:
    job = Job(ChatRequest("asked", [Message("user", "hi")]), target=Target(ScriptedBackend(backend), model))
    return exact_key(_keyed(job, ModelInfo(model, digest=digest)), "t")


def test_names_with_slashes_never_make_two_backends_and_models_one_key():
    assert _key("lab/gpu", "qwen") != _key("lab", "gpu/qwen")
    assert _key("lab", "gpu/qwen") == _key("lab", "gpu/qwen")
    assert _key("lab", "qwen", "sha256:aa") != _key("lab", "qwen", "sha256:bb")


async def test_a_model_pulled_again_under_its_name_is_not_answered_for_by_the_one_before(client, scripted):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "options": {"temperature": 0},
            "stream": False}
    scripted.digest = "sha256:aa"
    for expected in ("miss", "exact"):
        assert (await client.post("/api/chat", json=body)).headers["X-Velo-Cache"] == expected
    router = client.server.app[GENERATIONS].current.router
    router.info_ttl_s = 0  # each request refreshes the model's info behind its back
    scripted.digest = "sha256:bb"
    await client.post("/api/chat", json=body)
    await asyncio.sleep(0.05)
    assert (await client.post("/api/chat", json=body)).headers["X-Velo-Cache"] == "miss"
