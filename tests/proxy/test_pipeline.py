"""The pipeline's stages in order, and what it takes to add one: a class and a line in STAGES."""
from __future__ import annotations

import contextlib
from typing import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.errors import Overloaded
from adapters.protocol import Chunk
from proxy import pipeline
from proxy.app import make_app
from proxy.config import Config
from proxy.job import Job
from proxy.stages.base import Next, Stage
from proxy.stages.coalesce import Coalesce
from proxy.stages.observe import Observe
from tests.scripted import ScriptedBackend

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}


class Recorder(Stage):
    """A stage as a newcomer would write one: it sees the resolved job and every chunk on its way back."""
    seen: list[tuple[str, str, int]] = []

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        assert job.target is not None
        chunks = 0
        async with contextlib.aclosing(next(job)) as rest:
            async for chunk in rest:
                chunks += 1
                yield chunk
        Recorder.seen.append((job.caller.path, job.target.backend.name, chunks))


class Refuse(Stage):
    """A stage that answers without calling the rest (a rate limiter)."""

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        raise Overloaded("slow down", retry_after=3)
        yield  # pragma: no cover - makes this a generator, as stages are


def with_stage(monkeypatch, stage: type[Stage], before: type[Stage]) -> None:
    stages = list(pipeline.STAGES)
    stages.insert(stages.index(before), stage)
    monkeypatch.setattr(pipeline, "STAGES", tuple(stages))


async def test_a_new_stage_is_one_class_and_one_line(monkeypatch):
    with_stage(monkeypatch, Recorder, before=Coalesce)
    Recorder.seen = []
    backend = ScriptedBackend("s")
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as c:
        assert (await c.post("/api/chat", json=CHAT)).status == 200
        assert (await c.post("/v1/chat/completions", json={**CHAT, "stream": True})).status == 200
    assert Recorder.seen == [("/api/chat", "s", 4), ("/v1/chat/completions", "s", 4)]


@pytest.mark.parametrize("path, shape", [("/api/chat", "error"), ("/v1/chat/completions", "error.message")])
async def test_a_stage_may_refuse_in_the_clients_dialect(monkeypatch, path, shape):
    with_stage(monkeypatch, Refuse, before=Observe)
    backend = ScriptedBackend("s")
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as c:
        resp = await c.post(path, json=CHAT)
        body = await resp.json()
    assert resp.status == 429 and resp.headers["Retry-After"] == "3"
    value = body
    for key in shape.split("."):
        value = value[key]
    assert value == "slow down" and backend.requests == []


def test_stages_run_in_the_documented_order():
    names = [s.__name__ for s in pipeline.STAGES]
    assert names == ["Resolve", "Observe", "Limit", "KeepLoaded", "EditContext", "Fit", "OneToolCall",
                     "Cache", "Repair", "OfferTools", "Coalesce", "Admit", "CallBackend"]
