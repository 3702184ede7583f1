"""Cache fixtures: one loaded embedding model for the session and Velo apps over a scripted backend (the real Redis
and PostgreSQL+pgvector: tests/proxy/conftest.py)."""
from __future__ import annotations

import os
from typing import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import make_app
from proxy.cache import CacheConfig
from proxy.cache.encoders import default_model_path, load_encoder
from proxy.cache.semantic import Embedder
from proxy.config import Config, ModelConfig
from tests.scripted import ScriptedBackend


class SessionEmbedder(Embedder):
    """One model for the whole session: the layers and apps that use it cannot close it."""

    async def close(self) -> None:
        pass


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = load_encoder(default_model_path())
    return SessionEmbedder(model, model.dim)


@pytest.fixture
def shared_embedder(embedder: Embedder, monkeypatch: pytest.MonkeyPatch) -> Embedder:
    """Apps built in a test load the session's model instead of their own."""
    async def load(path: str | None = None, precision: str = "int8") -> Embedder:
        return embedder

    monkeypatch.setattr(Embedder, "load", staticmethod(load))
    return embedder


@pytest.fixture
async def velo() -> AsyncIterator[Callable[..., Awaitable[TestClient]]]:
    """`await velo(cache_cfg, backend)` starts a Velo app; all are closed at the end of the test. `models`: its
    [models] tables (tests of what the dialects share give "tiny" SAME_IN_EVERY_DIALECT)."""
    clients: list[TestClient] = []

    async def start(cache: CacheConfig, backend: ScriptedBackend | None = None,
                    api_keys: list[str] | None = None, models: dict[str, ModelConfig] | None = None) -> TestClient:
        config = Config(cache=cache, models=models or {})
        config.server.api_keys = api_keys or []
        client = TestClient(TestServer(make_app(config, {"scripted": backend or ScriptedBackend()}),
                                       handler_cancellation=True))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for c in clients:
        await c.close()
