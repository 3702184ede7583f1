"""Cache fixtures: one loaded embedding model for the session, the real Redis and PostgreSQL+pgvector (from
scripts/services.sh, started here when the test command did not), and Velo apps over a scripted backend."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import make_app
from proxy.cache import CacheConfig
from proxy.cache.encoders import default_model_path, load_encoder
from proxy.cache.semantic import Embedder
from proxy.config import Config, ModelConfig
from tests.scripted import ScriptedBackend

SERVICES = Path(__file__).resolve().parents[3] / "scripts" / "services.sh"


class SessionEmbedder(Embedder):
    """One model for the whole session: the layers and apps that use it cannot close it."""

    async def close(self) -> None:
        pass


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = load_encoder(default_model_path())
    return SessionEmbedder(model, model.dim)


@pytest.fixture(scope="session")
def services() -> dict[str, str]:
    """VELO_TEST_REDIS_URL / VELO_TEST_PG_DSN as the test command exports them, else started for this run."""
    names = ("VELO_TEST_REDIS_URL", "VELO_TEST_PG_DSN")
    if all(os.environ.get(n) for n in names):
        yield {n: os.environ[n] for n in names}
        return
    out = subprocess.run([str(SERVICES), "start"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"scripts/services.sh start failed: {out.stderr}", pytrace=False)
    started = dict(re.findall(r"(\w+)=(\S+)", out.stdout))
    yield started
    subprocess.run([str(SERVICES), "stop"], env={**os.environ, **started}, capture_output=True)


@pytest.fixture
def redis_url(services: dict[str, str]) -> str:
    return services["VELO_TEST_REDIS_URL"]


@pytest.fixture
def pg_dsn(services: dict[str, str]) -> str:
    return services["VELO_TEST_PG_DSN"]


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
