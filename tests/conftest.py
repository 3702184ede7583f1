"""Shared fixtures: the fake upstreams of tests/fakes.py and the real llama-server of tests/llama_server.py."""
import socket

import pytest

from tests.fakes import FakeOpenAI, OllamaDouble
from tests.llama_server import LlamaServer, LlamaServerMissing, chat_server, embedding_server


@pytest.fixture(autouse=True, scope="session")
def _data_home_in_tmp(tmp_path_factory):
    """The user's data folder, for the whole run, in a temporary one: apps made by module- and session-wide
    fixtures (test_fuzz's) come before any test's own folder below, and put presets.json.lock in the real
    ~/.local/share/velo."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data")))
        yield


@pytest.fixture(autouse=True)
def _presets_in_tmp(tmp_path_factory, monkeypatch):
    """Presets (proxy/presets.py) default to the user's data folder: each test keeps its own in a fresh one."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data")))


@pytest.fixture
def dead_port():
    """A port nothing answers on, held bound (never listening) for the whole test: pytest's `unused_tcp_port` is
    released at once, and a server the test starts later on port 0 may be handed it (a CI run was)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


@pytest.fixture
async def ollama_double():
    async with OllamaDouble() as double:
        yield double


@pytest.fixture
async def openai_fake():
    async with FakeOpenAI() as fake:
        yield fake


def _serve(server: LlamaServer):
    """Starts it, or fails (never skips) with what to run when the binary or the model is missing."""
    try:
        return server.start()
    except LlamaServerMissing as e:
        missing = str(e)
    pytest.fail(missing, pytrace=False)


@pytest.fixture(scope="session")
def llama_chat(tmp_path_factory):
    """The real llama-server for chat, completion and /infill; one process for the whole session."""
    server = _serve(chat_server(tmp_path_factory.mktemp("llama")))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llama_embed():
    """A second real llama-server, started with --embeddings (which then serves nothing else)."""
    server = _serve(embedding_server())
    yield server
    server.stop()
