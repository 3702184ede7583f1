"""One `velo serve` for the whole conformance suite, in front of every backend kind at once:

- `engine`: Velo's own engine with the shipped SmolLM2-135M;
- `llamacpp`: the real llama-server (tests/llama_server.py), through its native and OpenAI routes;
- `ollama`: the Ollama protocol double of tests/fakes.py (Ollama itself cannot run here), on a thread of its own;
- `openai`: an OpenAI-compatible upstream, which is the same llama-server's `/v1`;
plus the real llama-server started with --embeddings. The response cache is on (memory), so replays are tested too.
Everything is started once per session: the suite's cost is its requests, not its set-up.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from tests.fakes import OllamaDouble
from tests.http_ready import wait_until_ok
from tests.llama_server import free_port

ROOT = str(Path(__file__).resolve().parents[2])
CHAT_MODELS = {"engine": "smollm2:135m", "llamacpp": "llama-smollm2", "ollama": "double:latest",
               "openai": "oai-smollm2"}
EMBED_MODELS = {"engine": "smollm2:135m", "llamacpp": "llama-embed", "ollama": "double-embed:latest"}


@pytest.fixture(scope="session")
def ollama_upstream() -> Iterator[OllamaDouble]:
    """The double on its own event loop and thread, so that a session-wide server outlives each test's loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    double = OllamaDouble(models=(CHAT_MODELS["ollama"], EMBED_MODELS["ollama"]))
    asyncio.run_coroutine_threadsafe(double.start(), loop).result(30)
    yield double
    asyncio.run_coroutine_threadsafe(double.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture(scope="session")
def velo(llama_chat, llama_embed, ollama_upstream, tmp_path_factory) -> Iterator[str]:
    port, folder = free_port(), tmp_path_factory.mktemp("conformance")
    (folder / "config.toml").write_text(f"""
[server]
port = {port}
[[backends]]
name = "engine"
kind = "engine"
options = {{ progress = false }}
[[backends]]
name = "llama"
kind = "llamacpp"
url = "{llama_chat.url}"
models = ["{CHAT_MODELS['llamacpp']}"]
[[backends]]
name = "double"
kind = "ollama"
url = "{ollama_upstream.url}"
[[backends]]
name = "upstream"
kind = "openai"
url = "{llama_chat.url}/v1"
models = ["{CHAT_MODELS['openai']}"]
[[backends]]
name = "embed"
kind = "llamacpp"
url = "{llama_embed.url}"
models = ["{EMBED_MODELS['llamacpp']}"]
[[routes]]
match = "{CHAT_MODELS['openai']}"
backend = "upstream"
[[routes]]
match = "{CHAT_MODELS['llamacpp']}"
backend = "llama"
[[routes]]
match = "{EMBED_MODELS['llamacpp']}"
backend = "embed"
[[routes]]
match = "double*"
backend = "double"
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    log = open(folder / "velo.log", "wb")  # a file, not a pipe: a full pipe would stall the server
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(folder / "config.toml")],
                            cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_until_ok(url + "/api/tags", 180, proc=proc))
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
