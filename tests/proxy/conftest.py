"""A Velo app over an in-process scripted backend, served on a real loopback port so real clients can call it."""
from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import make_app
from proxy.config import Config, ServerConfig
from tests.scripted import ScriptedBackend


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
def base_url(client: TestClient) -> str:
    return str(client.make_url("")).rstrip("/")
