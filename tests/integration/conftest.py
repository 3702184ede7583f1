"""Velo served on a real loopback port (`make_app` under aiohttp's TestServer), called by the real `openai` and
`ollama` client packages. The response cache is off so every request reaches the backend under test."""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

import ollama
import openai
import pytest
from aiohttp.test_utils import TestServer

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config

CHAT_MODEL, EMBED_MODEL = "smollm2:135m", "smollm2-embed"


def config(*backends: BackendConfig, **kw) -> Config:
    return Config(backends=list(backends), cache=CacheConfig(enabled=False), **kw)


@asynccontextmanager
async def serve(cfg: Config) -> AsyncIterator[str]:
    """Velo on 127.0.0.1:<free port>, yielding its base URL."""
    server = TestServer(make_app(cfg), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def clients(url: str) -> tuple[openai.AsyncOpenAI, ollama.AsyncClient]:
    """Retries off: a test of an error status must see the first answer."""
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="test", max_retries=0), ollama.AsyncClient(host=url)


@pytest.fixture
async def velo_llama(llama_chat, llama_embed) -> AsyncIterator[str]:
    """Velo in front of the two real llama-server instances, under Ollama-style model names."""
    cfg = config(BackendConfig(name="llama", kind="llamacpp", urls=[llama_chat.url], models=[CHAT_MODEL]),
                 BackendConfig(name="embed", kind="llamacpp", urls=[llama_embed.url], models=[EMBED_MODEL]))
    async with serve(cfg) as url:
        yield url
