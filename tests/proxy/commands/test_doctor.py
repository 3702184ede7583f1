"""`velo doctor` against the fake upstreams, a Velo and the real llama-server on free ports: what it finds,
the config.toml it prints (loaded back with `load_config`), the CLI's --json and --write."""
from __future__ import annotations

import struct

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.commands.doctor import survey
from proxy.config import Config, load_config
from tests.fakes import FakeOpenAI, OllamaDouble
from tests.scripted import ScriptedBackend


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture
async def velo_port():
    server = TestServer(make_app(Config(), {"s": ScriptedBackend(models=("relayed:1b",))}), host="127.0.0.1", port=0)
    await server.start_server()
    yield server.port
    await server.close()


def _loads(text: str, tmp_path) -> Config:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(path)


async def test_finds_each_kind_and_configures_all_but_velo(velo_port, dead_port, tmp_path):
    async with OllamaDouble() as ollama, FakeOpenAI(models=["qwen-7b"]) as vllm, FakeOpenAI(api_key="k") as locked:
        ports = [_port(ollama.url), _port(vllm.url), _port(locked.url), velo_port, dead_port]
        found = await survey(ports=ports, timeout=2.0, models_dir=tmp_path / "none")
    servers = {s.port: s for s in found.servers}
    assert sorted(servers) == sorted(ports[:4])  # the unused port is not a server
    assert (servers[ports[0]].kind, servers[ports[0]].version) == ("ollama", "0.12.6")
    assert servers[ports[0]].models == ["smollm2:135m", "all-minilm:latest"]
    assert (servers[ports[1]].kind, servers[ports[1]].models) == ("openai", ["qwen-7b"])
    assert servers[ports[2]].kind == "openai" and servers[ports[2]].needs_key and "API key" in servers[ports[2]].note
    assert (servers[velo_port].kind, servers[velo_port].models) == ("velo", ["relayed:1b"])

    cfg = _loads(found.config_toml, tmp_path)
    assert [(b.kind, b.urls) for b in cfg.backends] == [
        ("ollama", [ollama.url]), ("openai", [vllm.url]), ("openai", [locked.url])]
    assert cfg.default_backend == cfg.backends[0].name == "ollama"
    parallel = next(s.value for s in found.ollama_settings if s.name == "OLLAMA_NUM_PARALLEL")
    assert cfg.backends[0].max_concurrency == int(parallel)
    assert f":{velo_port}" not in found.config_toml  # never a backend of itself
    assert '# api_key = "..."  # this server answered 401 without one' in found.config_toml


async def test_a_port_named_twice_is_one_backend(openai_fake, tmp_path):
    """`--ports 8000,8000` once printed two backends of one name, a config.toml `velo serve` refuses."""
    port = _port(openai_fake.url)
    found = await survey(ports=[port, port], timeout=2.0, models_dir=tmp_path / "none")
    assert [s.port for s in found.servers] == [port]
    assert [b.urls for b in _loads(found.config_toml, tmp_path).backends] == [[openai_fake.url]]


async def test_nothing_answering_gives_the_embedded_engine(dead_port, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "extra.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0))
    found = await survey(ports=[dead_port], timeout=1.0, models_dir=models)
    assert found.servers == []
    cfg = _loads(found.config_toml, tmp_path)
    assert [(b.name, b.kind, b.options) for b in cfg.backends] == [("engine", "engine", {})]
    assert cfg.default_backend is None  # the only backend is the default
    # the other installed GGUF is offered as a commented line that loads once uncommented
    offered = found.config_toml.replace("# options = ", "options = ")
    assert _loads(offered, tmp_path).backends[0].options == {"model": str(models / "extra.gguf")}


async def test_only_a_velo_answering_still_gives_the_engine(velo_port, tmp_path):
    found = await survey(ports=[velo_port], models_dir=tmp_path)
    assert [s.kind for s in found.servers] == ["velo"]
    assert [b.kind for b in _loads(found.config_toml, tmp_path).backends] == ["engine"]


async def test_a_velo_is_not_asked_what_would_start_its_llama_server(tmp_path):
    """A Velo passes `/props` on to its llama-server, which that starts when it is a stopped managed one (and, with
    `max_loaded` 1, stops another to make room): doctor asks `/props` only of what does not imitate Ollama."""
    async with FakeOpenAI(models=["m"]) as llama:
        cfg = Config(backends=[BackendConfig(name="llama", kind="llamacpp", urls=[llama.url], max_concurrency=1)])
        app, asked = make_app(cfg), []

        @web.middleware
        async def record(request: web.Request, handler):
            asked.append(request.path)
            return await handler(request)

        app.middlewares.insert(0, record)  # what doctor asks of the Velo: Velo itself asks /props with its listings
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        try:
            found = await survey(ports=[server.port], timeout=2.0, models_dir=tmp_path)
            assert [s.kind for s in found.servers] == ["velo"]
            assert asked and "/props" not in asked
        finally:
            await server.close()


@pytest.mark.slow
async def test_the_real_llama_server(llama_chat, tmp_path):
    found = await survey(ports=[_port(llama_chat.url)], models_dir=tmp_path)
    (server,) = found.servers
    assert (server.kind, server.product) == ("llamacpp", "llama-server")
    assert server.models == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert (server.slots, server.context) == (4, 512)  # -c 2048 shared by 4 slots (tests/llama_server.py)
    cfg = _loads(found.config_toml, tmp_path)
    assert [(b.name, b.kind, b.urls) for b in cfg.backends] == [("llama-server", "llamacpp", [llama_chat.url])]


async def test_cli_json_and_write(run_cli, velo_port, tmp_path):
    async with OllamaDouble() as ollama:
        target = tmp_path / "config.toml"
        args = ("doctor", "--ports", f"{_port(ollama.url)},{velo_port}", "--models-dir", str(tmp_path))
        result = await run_cli(*args, "--json", "--write", str(target))
        assert result.code == 0, result.err
        report = orjson.loads(result.out)
        assert [s["kind"] for s in report["servers"]] == ["ollama", "velo"]
        assert report["hardware"]["cpu"]["cores"] >= 1 and report["hardware"]["memory_total"] > 0
        assert set(report["hardware"]["cpu"]["features"]) == {"AVX2", "AVX-512", "AMX", "bf16"}
        assert {s["name"] for s in report["ollama_settings"]} == {
            "OLLAMA_NUM_PARALLEL", "OLLAMA_KEEP_ALIVE", "OLLAMA_CONTEXT_LENGTH", "OLLAMA_FLASH_ATTENTION",
            "OLLAMA_KV_CACHE_TYPE"}
        assert target.read_text() == report["config_toml"]
        assert load_config(target).backends[0].urls == [ollama.url]

        again = await run_cli(*args, "--write", str(target))
        assert again.code == 1 and again.err == f"velo doctor: {target} exists: remove it or --write another path\n"

        text = await run_cli(*args)
        assert text.code == 0
        for heading in ("Hardware", "Model servers on 127.0.0.1", "Model files", "config.toml",
                        "Ollama settings for this machine"):
            assert f"\n{heading}" in "\n" + text.out
        assert "a Velo gateway: not configured as a backend of itself" in text.out


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_is_no_positive_number_is_a_usage_error(timeout, capsys):
    """aiohttp reads 0 or less (and nan) as no timeout at all: doctor waited forever on a port that accepts and says
    nothing; inf was its OverflowError."""
    from proxy.cli import main
    with pytest.raises(SystemExit) as done:
        main(["doctor", "--timeout", timeout])
    assert done.value.code == 2 and "expected a positive number of seconds" in capsys.readouterr().err
