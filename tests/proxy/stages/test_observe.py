"""The observe stage drops a stream's chunks with nothing to send, whatever the dialect's writer would make of them:
the stream's first byte is its first content, so an error before any keeps its HTTP status."""
from __future__ import annotations

from typing import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.errors import BackendError
from adapters.protocol import ChatRequest, Chunk
from proxy.app import make_app
from proxy.config import Config
from tests.scripted import ScriptedBackend


class EmptyThenBroken(ScriptedBackend):
    """Two empty chunks (a role-only delta, prompt progress), then the backend fails before any content."""

    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        self.requests.append(req)
        return self._broken()

    async def _broken(self) -> AsyncIterator[Chunk]:
        yield Chunk()
        yield Chunk()
        raise BackendError("backend broke before its answer")


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": "tiny", "input": "hi"}),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
])
async def test_a_stream_that_fails_after_only_empty_chunks_keeps_its_status(path, body):
    async with TestClient(TestServer(make_app(Config(), {"s": EmptyThenBroken("s")}))) as c:
        resp = await c.post(path, json={**body, "stream": True})
        assert resp.status == 502, await resp.text()


async def test_a_one_answer_request_is_folded_whole():
    backend = ScriptedBackend("s")
    backend.script.empties = 2
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as c:
        resp = await c.post("/api/chat", json={"model": "tiny:latest", "stream": False,
                                               "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status == 200 and (await resp.json())["message"]["content"] == "Hello world"
