"""`velo serve`'s command line: which config file, what it may listen on, and its signals, each misuse a one-line
message rather than a traceback or a silent default."""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.base import BackendConfig
from proxy.cli import _Hangup, check_listen, default_config, find_config, main
from proxy.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_a_config_file_named_by_velo_config_must_be_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VELO_CONFIG", str(tmp_path / "typo.toml"))
    with pytest.raises(ConfigError, match=r"typo.toml \(from VELO_CONFIG\) not found"):
        find_config(None)
    with pytest.raises(ConfigError, match=r"\(from --config\) is not a file"):
        find_config(str(tmp_path))
    monkeypatch.delenv("VELO_CONFIG")
    assert find_config(None) is None
    (tmp_path / "config.toml").write_text("")
    assert find_config(None).name == "config.toml"


def test_a_config_file_with_a_byte_order_mark_loads_and_one_not_in_utf8_is_named(tmp_path):
    marked = tmp_path / "bom.toml"
    marked.write_bytes("\ufeff[server]\nport = 9001\n".encode())
    assert load_config(marked).server.port == 9001
    latin = tmp_path / "latin.toml"
    latin.write_bytes("[server]\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(latin)


@pytest.mark.parametrize("args", [["--port", "70000"], ["--port", "0"], ["--log-level", "bogus"]])
def test_bad_flags_are_usage_errors(args, capsys):
    with pytest.raises(SystemExit) as done:
        main(["serve", *args])
    assert done.value.code == 2 and "Traceback" not in capsys.readouterr().err


def test_a_port_in_use_is_found_before_anything_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="cannot listen on 127.0.0.1"):
            check_listen("127.0.0.1", taken.getsockname()[1])


class _Reloader:
    def __init__(self) -> None:
        self.triggered = 0

    def trigger(self) -> None:
        self.triggered += 1


def test_a_sighup_while_starting_reloads_once_serving_and_one_without_a_file_is_said(caplog):
    reloader = _Reloader()
    hangup = _Hangup(reloader)  # type: ignore[arg-type]
    hangup()
    hangup()
    assert reloader.triggered == 0
    hangup.serving()
    assert reloader.triggered == 1
    hangup()
    assert reloader.triggered == 2
    with caplog.at_level(logging.WARNING, logger="velo"):
        _Hangup(None)()
    assert "no config file to reload" in caplog.text


async def test_a_config_file_that_names_no_backend_gets_the_default_one(tmp_path, monkeypatch):
    async def ollama_answers(*_: object) -> bool:
        return True
    monkeypatch.setattr("proxy.default_backend.ollama_running", ollama_answers)
    path = tmp_path / "config.toml"
    path.write_text("[server]\nport = 9000\n")
    config = await default_config(load_config(path))
    assert config.server.port == 9000 and [b.kind for b in config.backends] == ["ollama"]
    assert config.default_backend == "ollama"
    named = load_config(path)
    named.backends = [BackendConfig(name="mine", kind="openai", urls=["http://h:1"])]
    assert (await default_config(named)).backends == named.backends


def test_listening_beyond_this_machine_without_api_keys_is_warned_of(tmp_path, monkeypatch, caplog):
    ran = []
    monkeypatch.setattr("proxy.cli.run_server", lambda main: (ran.append(main), main.close()))
    monkeypatch.setattr("proxy.cli.check_listen", lambda host, port: None)
    path = tmp_path / "config.toml"
    path.write_text('[[backends]]\nname = "o"\nkind = "ollama"\nurl = "http://h:1"\n')
    with caplog.at_level(logging.WARNING, logger="velo"):
        main(["serve", "--config", str(path), "--host", "0.0.0.0"])
        assert "without [server] api_keys" in caplog.text
        caplog.clear()
        main(["serve", "--config", str(path)])  # 127.0.0.1: this machine only
        assert "api_keys" not in caplog.text
    assert len(ran) == 2


def test_a_start_that_fails_is_one_line_and_status_1(tmp_path, capsys, caplog, unused_tcp_port):
    """A cache tier whose Redis is down: a 40-line traceback, and one more from closing the tier that never
    opened."""
    path = tmp_path / "config.toml"
    path.write_text(f'[server]\nport = {unused_tcp_port}\n[cache]\nredis_url = "redis://127.0.0.1:1/0"\n'
                    '[[backends]]\nname = "o"\nkind = "openai"\nurl = "http://127.0.0.1:9"\n')
    with pytest.raises(SystemExit) as done:
        main(["serve", "--config", str(path), "--log-level", "ERROR"])
    err = capsys.readouterr().err
    assert done.value.code == 1 and "Traceback" not in err
    assert not [r for r in caplog.records if r.name.startswith("velo") and r.exc_info]  # another test's stray
    # task, finished on this test's loop, may log its own
    assert err.endswith("velo: could not start: Error 111 connecting to 127.0.0.1:1. Connection refused. "
                        "(--log-level DEBUG shows where)\n")


async def test_a_stop_while_starting_never_listens(caplog, unused_tcp_port):
    """SIGTERM while the engine loaded its model: Velo went on to log "Velo listening", opened the port and took
    requests, then shut down. The stop is set here by a start-up step, as the signal sets it during the load."""
    import asyncio

    from aiohttp import web

    from proxy import cli
    from proxy.config import Config, ServerConfig
    stop = asyncio.Event()
    made = cli.make_app

    def app_stopped_while_starting(*args: object, **kwargs: object) -> web.Application:
        app = made(*args, **kwargs)

        async def signalled(_: web.Application) -> None:
            stop.set()
        app.on_startup.append(signalled)
        return app
    config = Config(server=ServerConfig(port=unused_tcp_port), backends=[
        BackendConfig(name="o", kind="openai", urls=["http://127.0.0.1:9"])])
    with caplog.at_level(logging.INFO, logger="velo"), pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "make_app", app_stopped_while_starting)
        await asyncio.wait_for(cli.serve(config, stop), 30)
    assert "listening" not in caplog.text.replace("not listening", "")
    assert "stopped while starting: not listening" in caplog.text


def slow_load(serving: bool) -> list[str]:
    """`python -m proxy serve` whose engine's model load takes a minute in a thread, as the real one does (which no
    signal stops either), and says "loading" as it starts. `serving`: Velo serves while it loads, as when a request
    loads the model again after its keep_alive unloaded it."""
    code = ("import asyncio, runpy, time, engine\nfrom adapters.engine import EngineBackend\n"
            "def load(*_):\n    print('loading', flush=True)\n    time.sleep(60)\n"
            "engine.LLMEngine.from_pretrained = load\n")
    if serving:
        code += ("async def start(self):\n    self.loads = asyncio.ensure_future(self._ready())\n"
                 "async def listed(self):\n    return []\n"
                 "EngineBackend.start, EngineBackend.list_models = start, listed\n")
    return [sys.executable, "-c", code + "runpy.run_module('proxy', run_name='__main__')"]


ENGINE = 'name = "e"\nkind = "engine"\noptions = {{ model = "{}" }}\n'
OPENAI = 'name = "o"\nkind = "openai"\nurl = "http://127.0.0.1:9"\n'


def _loading_velo(tmp_path: Path, port: int, backend: str, serving: bool) -> tuple[Path, subprocess.Popen, str]:
    """`slow_load`'s Velo on `port` with one backend (ENGINE or OPENAI), its config file, and the config's start."""
    (tmp_path / "model.gguf").write_bytes(b"")
    config, server = tmp_path / "config.toml", f"[server]\nport = {port}\n[[backends]]\n"
    config.write_text(server + backend.format(tmp_path / "model.gguf"))
    proc = subprocess.Popen([*slow_load(serving), "serve", "--config", str(config)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    return config, proc, server


def _until(proc: subprocess.Popen, line: str) -> None:
    while line not in proc.stderr.readline():
        assert proc.poll() is None


def _ends_at_once(proc: subprocess.Popen, sig: signal.Signals = signal.SIGINT) -> str:
    """`sig` to a Velo whose model load runs on in a thread: it exits within 5 s, saying so in one line; its log."""
    proc.send_signal(sig)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=15)
    assert time.monotonic() - sent < 5 and proc.returncode == 0, err
    assert "stopped while loading a model: exiting without waiting for the load" in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("serving", [False, True], ids=["starting", "serving"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_while_a_model_loads_ends_velo_at_once(sig, serving, tmp_path, unused_tcp_port):
    """Ctrl-C during the engine's load waited for all of it (SmolLM2: 34 s on a busy machine), then exited: the
    start, and once serving the backend's close, waited to unload what it loaded, and the interpreter's exit joins
    the load's thread."""
    _, proc, _ = _loading_velo(tmp_path, unused_tcp_port, ENGINE, serving)
    try:
        assert proc.stdout.readline() == "loading\n"
        if serving:
            _until(proc, "Velo listening")
        _ends_at_once(proc, sig)
    finally:
        proc.kill()


def test_a_signal_while_a_reload_loads_a_new_model_ends_velo_at_once(tmp_path, unused_tcp_port):
    """Ctrl-C while a SIGHUP's reload loaded a new engine model waited for the whole load (4.2 s after SIGINT in
    one measurement; a minute here): the reload's generation never became current, so the exit did not see its
    load's thread, which the interpreter's exit joins. The abandoned reload is said (it was not)."""
    config, proc, server = _loading_velo(tmp_path, unused_tcp_port, OPENAI, serving=False)
    try:
        _until(proc, "Velo listening")
        config.write_text(server + ENGINE.format(tmp_path / "model.gguf"))
        proc.send_signal(signal.SIGHUP)
        assert proc.stdout.readline() == "loading\n"
        assert "config reload cancelled, configuration 1 stays in force: Velo is stopping" in _ends_at_once(proc)
    finally:
        proc.kill()


def test_a_signal_after_a_reload_dropped_an_engine_while_it_loaded_ends_velo_at_once(tmp_path, unused_tcp_port):
    """A reload that drops (or changes) an engine while it loads its model closes it at once, its load running on;
    a signal then waited for that load (a minute here): the exit looked only at the configuration in force."""
    config, proc, server = _loading_velo(tmp_path, unused_tcp_port, ENGINE, serving=True)
    try:
        assert proc.stdout.readline() == "loading\n"
        _until(proc, "Velo listening")
        config.write_text(server + OPENAI)
        proc.send_signal(signal.SIGHUP)
        _until(proc, "configuration 1 closed")
        _ends_at_once(proc)
    finally:
        proc.kill()


def test_a_start_that_fails_while_another_model_loads_is_said_at_once(tmp_path, unused_tcp_port):
    """One engine's model that does not load, another's loading: "could not start" came when the other load ended
    (20 s later here, the whole load in general), the exit joining its thread. Here a load fails after 0.2 s."""
    code = ("import runpy, time, engine\ndef load(path, *_):\n    if 'bad' in str(path):\n        time.sleep(0.2)\n"
            "        raise ValueError('not a model')\n    print('loading', flush=True)\n    time.sleep(60)\n"
            "engine.LLMEngine.from_pretrained = load\nrunpy.run_module('proxy', run_name='__main__')")
    config = f"[server]\nport = {unused_tcp_port}\n"
    for name in ("good", "bad"):
        (tmp_path / f"{name}.gguf").write_bytes(b"")
        config += f'[[backends]]\nname = "{name}"\nkind = "engine"\noptions = {{ model = "{tmp_path / name}.gguf" }}\n'
    (tmp_path / "config.toml").write_text(config)
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--config", str(tmp_path / "config.toml")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline() == "loading\n"
        began = time.monotonic()
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert time.monotonic() - began < 5 and proc.returncode == 1, err
    assert err.strip().endswith("velo: could not start: not a model (--log-level DEBUG shows where)"), err


def test_a_ctrl_c_before_velo_takes_the_signal_is_a_quiet_130(tmp_path):
    """Ctrl-C in velo serve's first seconds, while it reads its config (an engine's imports torch: 1-3 s), was a
    40-line KeyboardInterrupt traceback through torch's import and exit 1. SIGINT taken as from a terminal (a suite
    run in the background has it ignored); the config's reading takes a minute here and says "reading"."""
    code = ("import runpy, signal, time, proxy.cli\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "def read(path):\n    print('reading', flush=True)\n    time.sleep(60)\n"
            "proxy.cli.load_config = read\nrunpy.run_module('proxy', run_name='__main__')")
    (tmp_path / "config.toml").write_text("")
    status, err = _ctrl_c_once(code, "reading", tmp_path, "serve", "--config", str(tmp_path / "config.toml"))
    assert status == 130 and "Traceback" not in err, err
    assert err.strip().endswith("stopped while starting: not listening"), err


def test_a_ctrl_c_among_velos_imports_is_a_quiet_130(tmp_path):
    """Ctrl-C in the 1.4 s that `velo`'s imports take, before any of its code runs, was a KeyboardInterrupt traceback
    through whichever module was loading. Here aiohttp's import takes a minute and says "importing"."""
    code = ("import builtins, signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "real = builtins.__import__\n"
            "def slow(name, *args, **kwargs):\n"
            "    if name == 'aiohttp':\n        print('importing', flush=True)\n        time.sleep(60)\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = slow\nfrom proxy.entry import main\nsys.exit(main(['serve']))")
    assert _ctrl_c_once(code, "importing", tmp_path) == (130, "velo: stopped while starting: not listening\n")


def _ctrl_c_once(code: str, said: str, cwd: Path, *args: str) -> tuple[int, str]:
    """`code` run with Velo's checkout on the path, and Ctrl-C once it printed `said`: its exit status and stderr."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline() == said + "\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    return proc.returncode, err


def test_velo_serve_exits_with_its_heap_out_of_the_collectors_sight(tmp_path, unused_tcp_port):
    """The exit's collections walked the whole heap, which serve() makes collectable again as it ends: an idle
    Ctrl-C took 1.1-1.3 s to exit with SmolLM2 loaded, 0.4 s with the heap frozen. The count is read at the exit."""
    code = ("import atexit, gc, runpy\natexit.register(lambda: print(gc.get_freeze_count(), flush=True))\n"
            "runpy.run_module('proxy', run_name='__main__')")
    (tmp_path / "config.toml").write_text(f'[server]\nport = {unused_tcp_port}\n[[backends]]\nname = "o"\n'
                                          'kind = "openai"\nurl = "http://127.0.0.1:9"\n')
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--config", str(tmp_path / "config.toml")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        while "Velo listening" not in proc.stderr.readline():
            assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0 and int(out) > 10_000, err


@pytest.mark.parametrize("port", ["abc", "0", "65536", "-1"])
def test_a_port_that_is_no_port_is_said_in_words(port, capsys):
    with pytest.raises(SystemExit) as ended:
        main(["serve", "--port", port])
    assert ended.value.code == 2
    assert f"argument --port: {port!r} is not a port (1-65535)" in capsys.readouterr().err
