"""Velo on a real loopback port for the commands to talk to, and a way to run `velo ...` as a user would.

`run_cli` calls `proxy.cli.main` in a worker thread: each command starts its own event loop, as it does from
a shell, while the servers it talks to keep running on the test's loop. Piped stdin is a `StringIO`.
"""
from __future__ import annotations

import asyncio
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.cli import main
from proxy.config import Config
from tests.scripted import ScriptedBackend

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def scripted() -> ScriptedBackend:
    return ScriptedBackend(models=("tiny:latest", "other:1b"))


@pytest.fixture
def run_cli(capsys, monkeypatch):
    async def run(*argv: str, stdin: str = "") -> CliResult:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        code = await asyncio.to_thread(main, list(argv))
        out, err = capsys.readouterr()
        return CliResult(code, out, err)
    return run


@pytest.fixture
async def velo_over_llama(llama_chat):
    """Velo (response cache on) in front of the real llama-server, under the Ollama-style name smollm2:135m."""
    cfg = Config(backends=[BackendConfig(name="llama", kind="llamacpp", urls=[llama_chat.url],
                                         models=["smollm2:135m"])])
    server = TestServer(make_app(cfg), host="127.0.0.1", port=0)
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()
