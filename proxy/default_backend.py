"""The backend a config that names none is served by: a local Ollama if one answers, else Velo's engine with the
model shipped on PyPI. `velo serve` asks at start, and a reload asks for a file edited to name none."""
from __future__ import annotations

import asyncio
import logging

import aiohttp

from adapters.base import BackendConfig

from .config import Config

log = logging.getLogger("velo")
OLLAMA_DEFAULT_URL = "http://127.0.0.1:11434"


async def ollama_running(url: str = OLLAMA_DEFAULT_URL, timeout: float = 0.5) -> bool:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(f"{url}/api/version") as r:
                return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


async def default_config(config: Config | None = None) -> Config:
    """`config` (none: the defaults) with the default backend where it names none. A file that set only `port`
    served nothing (every model a 404, /ready "ready")."""
    config = config or Config()
    if config.backends:
        return config
    if await ollama_running():
        log.info("no backends configured: using the Ollama at %s", OLLAMA_DEFAULT_URL)
        backend = BackendConfig(name="ollama", kind="ollama", urls=[OLLAMA_DEFAULT_URL])
    else:
        log.info("no backends configured and no Ollama: starting the embedded engine with the shipped SmolLM2-135M")
        backend = BackendConfig(name="engine", kind="engine")
    config.backends, config.default_backend = [backend], backend.name
    return config
