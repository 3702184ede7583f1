"""The cache stage's key: under the backend and the model that answer, which no two configurations can share."""
from __future__ import annotations

from adapters.protocol import ChatRequest, Message
from proxy.cache.keys import exact_key
from proxy.job import Job
from proxy.router import Target
from proxy.stages.cache import _keyed
from tests.scripted import ScriptedBackend


def _job(backend: str, model: str) -> Job:
    return Job(ChatRequest("asked", [Message("user", "hi")]), target=Target(ScriptedBackend(backend), model))


def test_names_with_slashes_never_make_two_backends_and_models_one_key():
    one, other = _keyed(_job("lab/gpu", "qwen")), _keyed(_job("lab", "gpu/qwen"))
    assert exact_key(one, "t") != exact_key(other, "t")
    assert exact_key(_keyed(_job("lab", "gpu/qwen")), "t") == exact_key(other, "t")
