"""One `velo serve` for the whole conformance suite, in front of every backend kind at once:

- `engine`: Velo's own engine with the shipped SmolLM2-135M, without its prefix cache (a request asked twice must
  get one greedy answer, and on a CPU with AMX a cached prefix's one-token chunk rounds unlike a whole prompt);
- `llamacpp`: the real llama-server (tests/llama_server.py), through its native and OpenAI routes;
- `ollama`: the Ollama protocol double of tests/fakes.py (Ollama itself cannot run here), on a thread of its own;
- `openai`: an OpenAI-compatible upstream, which is the same llama-server's `/v1`;
plus the real llama-server started with --embeddings. The response cache is on (memory), so replays are tested too.
Everything is started once per session: the suite's cost is its requests, not its set-up.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Iterator

import pytest

from tests.fakes import OllamaDouble
from tests.velo_serve import velo_serve

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
    with velo_serve(tmp_path_factory.mktemp("conformance"), f"""
[[backends]]
name = "engine"
kind = "engine"
options = {{ progress = false, enable_prefix_cache = false }}
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
""") as url:
        yield url
