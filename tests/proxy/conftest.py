"""A Velo app over an in-process scripted backend, served on a real loopback port so real clients can call it; the
real Redis and PostgreSQL+pgvector of the shared tiers (from scripts/services.sh, started here when the test command
did not)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config, ServerConfig
from tests.fakes import FakeOpenAI
from tests.scripted import ScriptedBackend

SERVICES = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"


@pytest.fixture
def scripted() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
def config() -> Config:
    return Config(server=ServerConfig(max_body_bytes=64 * 1024))


@pytest.fixture
async def client(scripted: ScriptedBackend, config: Config):
    app = make_app(config, {"scripted": scripted})
    async with TestClient(TestServer(app, handler_cancellation=True)) as c:
        yield c


@pytest.fixture
def served_cache() -> CacheConfig:
    """The response cache of `served`'s Velo: off, so every request reaches the fake; a module on the cache overrides
    this fixture."""
    return CacheConfig(enabled=False)


@pytest.fixture
async def served(served_cache: CacheConfig) -> AsyncIterator[tuple[TestClient, FakeOpenAI]]:
    """Velo over one FakeOpenAI backend ("up", model "m"): the client, and the fake whose requests tests read."""
    async with FakeOpenAI(models=["m"]) as up:
        config = Config(backends=[BackendConfig(name="up", kind="openai", urls=[up.url])], default_backend="up",
                        cache=served_cache)
        async with TestClient(TestServer(make_app(config))) as c:
            yield c, up


@pytest.fixture
def base_url(client: TestClient) -> str:
    return str(client.make_url("")).rstrip("/")


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
