"""`velo serve`: load config.toml (or pick the embedded default) and serve on :8000.
`velo doctor`, `velo bench` and `velo chat` live in proxy/commands/."""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Coroutine

from aiohttp import web

from adapters.wording import counted

from .app import make_app
from .browser_guard import is_loopback
from .commands import bench, chat, doctor
from .config import Config, ConfigError, ServerConfig, load_config
from .default_backend import default_config
from .inflight import InFlight, ShuttingDown
from .log_setup import AccessLog, configure_logging
from .request_bounds import server_options
from .reload import Reloader
from .state import GENERATIONS, RELOADER

log = logging.getLogger("velo")
_AFTER_ENDING_S = 2.0  # for ended requests to write their error events, and for aiohttp's own shutdown


def find_config(explicit: str | None) -> Path | None:
    """`--config`, else $VELO_CONFIG, else ./config.toml if there is one. A file named by the first two must be
    there: a mistyped VELO_CONFIG started the default setup, without the file's API keys."""
    for candidate, named in ((explicit, "--config"), (os.environ.get("VELO_CONFIG"), "VELO_CONFIG")):
        if candidate:
            if not Path(candidate).is_file():
                why = "is not a file" if Path(candidate).exists() else "not found"
                raise ConfigError(f"config file {candidate} (from {named}) {why}")
            return Path(candidate)
    return Path("config.toml") if Path("config.toml").is_file() else None


def check_listen(host: str, port: int) -> None:
    """Whether Velo can listen there, asked before the backends start (an engine loads its model first): a port in
    use was a traceback after the load, with the backends' sessions left unclosed."""
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                                  flags=socket.AI_PASSIVE):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server itself binds
                probe.bind(address)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e


async def serve(config: Config, stop: asyncio.Event | None = None, config_path: Path | None = None) -> bool:
    """Serves until SIGINT/SIGTERM (or `stop` is set), then shuts down gracefully: the listening socket closes
    and idle connections are told to close, in-flight requests get `server.shutdown_grace_s` to finish, those
    still running are ended with their dialect's error (a stream's error event; 503 "shutting down"), which
    cancels their backend work, and only then are the backends closed (before, aiohttp's own shutdown waited
    twice the grace and then cut streams with no error event). With `config_path`, SIGHUP or an edit of that file
    reloads the configuration (proxy/reload.py). The signals are Velo's from the start: a SIGHUP while an engine
    loaded its model, or to a Velo without a config file, ended the process (`systemctl reload` sends one).
    True (or a StartFailed saying so) when a model's load still runs in a thread, which nothing stops: the process's
    exit waits for it."""
    app = make_app(config, config_path=config_path)
    runner = web.AppRunner(app, handler_cancellation=True,  # a client that leaves cancels its handler
                           shutdown_timeout=_AFTER_ENDING_S, access_log_class=AccessLog,
                           **server_options(config.server))
    reloader = app.get(RELOADER)
    stop, hangup = stop or asyncio.Event(), _Hangup(reloader)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hangup)
    try:
        await _start_and_wait(runner, config.server, stop, hangup)
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        if reloader is not None:
            reloader.stop()
        await _wind_down(runner, config.server.shutdown_grace_s)
    return app[GENERATIONS].loading


async def _start_and_wait(runner: web.AppRunner, server: ServerConfig, stop: asyncio.Event, hangup: _Hangup) -> None:
    """Starts the app, then listens until `stop`; a start that fails is one line, as a config error."""
    try:
        await _set_up(runner, stop)
    except Exception as e:  # a backend, a cache tier or a model that cannot open
        log.debug("start-up failed", exc_info=True)
        raise StartFailed(f"could not start: {e} (--log-level DEBUG shows where)",
                          runner.app[GENERATIONS].loading) from e
    if stop.is_set():  # Ctrl-C or SIGTERM while a model loaded: it was "listening" and served for a moment
        log.info("stopped while starting: not listening")
        return
    await web.TCPSite(runner, server.host, server.port).start()
    _freeze_the_heap()
    log.info("Velo listening on http://%s", _address(server.host, server.port))
    hangup.serving()
    await stop.wait()


async def _wind_down(runner: web.AppRunner, grace_s: float) -> None:
    """Ends what started: requests in flight get `grace_s`, and a second Ctrl-C or SIGTERM ends what is left now
    (it printed a traceback)."""
    loop = asyncio.get_running_loop()
    hurry = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, hurry.set)
    gc.unfreeze()  # collectable again once it is no longer served (a process that serves again, tests)
    try:
        if runner.server is None:  # it never started: nothing in flight
            await runner.cleanup()
        else:
            await _shut_down(runner, runner.app[GENERATIONS].current.pipeline.inflight, grace_s, hurry)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _set_up(runner: web.AppRunner, stop: asyncio.Event) -> None:
    """runner.setup(), cancelled when `stop` is set first: Ctrl-C during SmolLM2's load waited for all of it."""
    setup, stopped = asyncio.ensure_future(runner.setup()), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((setup, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        setup.cancel()  # where it has not ended: the stop came first
    await asyncio.wait((setup,))
    if not setup.cancelled():
        setup.result()


def _freeze_the_heap() -> None:
    """What is alive once Velo serves (torch, transformers and the rest imported, models loaded: ~500k objects) is
    moved out of the garbage collector's sight. Each full collection walked it all, 220 ms with the loop held, and
    a large request (a 2.7 MB tool list, 4 MB of tool-call arguments) set one off; after the freeze, 0.0 ms."""
    gc.collect()  # the start's garbage is not frozen with the rest
    gc.freeze()


class _Hangup:
    """SIGHUP: a reload of the config file, once Velo serves (one asked while it starts waits for that)."""

    def __init__(self, reloader: Reloader | None) -> None:
        self.reloader, self.started, self.asked = reloader, False, False

    def __call__(self) -> None:
        if self.reloader is None:
            log.warning("SIGHUP: there is no config file to reload (Velo started without one)")
        elif self.started:
            self.reloader.trigger()
        else:
            log.info("SIGHUP while starting: the config file is read again once Velo serves")
            self.asked = True

    def serving(self) -> None:
        self.started = True
        if self.asked:
            self()


def _address(host: str, port: int) -> str:
    """host:port as a URL writes it: an IPv6 address in brackets, no host as every address."""
    host = host or "0.0.0.0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _shut_down(runner: web.AppRunner, inflight: InFlight, grace: float, hurry: asyncio.Event) -> None:
    log.info("shutting down: finishing in-flight requests (up to %gs; a second Ctrl-C ends them now)", grace)
    for site in list(runner.sites):
        await site.stop()
    assert runner.server is not None
    runner.server.pre_shutdown()  # kept-alive connections take no new request
    if not await inflight.drained(grace, until=hurry):
        ended = inflight.cancel_all(ShuttingDown("Velo is shutting down; send the request again"))
        if hurry.is_set():
            log.warning("%s ended at a second signal", counted(ended, "request"))
        else:
            log.warning("ended %s that outlived the grace period of %gs", counted(ended, "request"), grace)
        await inflight.drained(_AFTER_ENDING_S)
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="velo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="run the proxy")
    serve_p.add_argument("--config", help="path to config.toml (default: $VELO_CONFIG, ./config.toml)")
    serve_p.add_argument("--host", help="address to listen on (default: the config's server.host, 127.0.0.1)")
    serve_p.add_argument("--port", type=_port, help="port to listen on (default: the config's server.port, 8000)")
    serve_p.add_argument("--log-level", default="INFO", type=str.upper, choices=_LEVELS, help="default: INFO")
    for command in (doctor, bench, chat):
        command.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command != "serve":
        return args.func(args)
    try:
        return _serve(parser, args)
    except KeyboardInterrupt:  # before serve() takes the signal (an engine config's torch import): it was a traceback
        log.info("stopped while starting: not listening")
        return 130


def _serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if hasattr(signal, "SIGHUP"):  # until serve() takes it: by default a SIGHUP ends the process
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    configure_logging(args.log_level)
    try:
        path = find_config(args.config)
        config = asyncio.run(default_config(load_config(path) if path else None))
    except ConfigError as e:
        parser.exit(2, f"velo: config error: {e}\n")
    if path is not None:
        log.info("configuration from %s", path.resolve())
    config.server.host = config.server.host if args.host is None else args.host
    config.server.port = config.server.port if args.port is None else args.port
    try:
        check_listen(config.server.host, config.server.port)
    except ConfigError as e:
        parser.exit(1, f"velo: {e}\n")
    if not config.server.keys and not is_loopback(config.server.host):
        log.warning("listening on %s without [server] api_keys: anyone who reaches this address can use every "
                    "backend", _address(config.server.host, config.server.port))
    try:
        run_server(_serve_then_exit(config, path))
    except StartFailed as e:
        parser.exit(1, f"velo: {e}\n")
    return 0


async def _serve_then_exit(config: Config, path: Path | None) -> None:
    """serve(), and the exit at once where a model's load still runs: its thread cannot be stopped, and asyncio.run
    and the interpreter join it (Ctrl-C during SmolLM2's load exited 34 s later). Nothing is lost: Velo has shut
    down, and a llama-server it runs dies with it. The heap is frozen again for the exit, whose collections walked
    all of it: an idle Ctrl-C took 1.1-1.3 s to exit with the engine's SmolLM2 loaded (2.7 s on a busy machine),
    0.4 s frozen."""
    try:
        loading = await serve(config, config_path=path)
    except StartFailed as e:
        if not e.loading:
            raise
        sys.stderr.write(f"velo: {e}\n")  # as _serve says it; another engine's load ran on (one failed to load)
        sys.stderr.flush()
        os._exit(1)
    if loading:
        log.info("stopped while loading a model: exiting without waiting for the load")
        os._exit(0)
    gc.freeze()


class StartFailed(Exception):
    """What the app's start-up raised, said in one line (it was a 40-line traceback); `loading`: a model's load
    still runs in a thread (another backend's), which the exit would wait for."""

    def __init__(self, message: str, loading: bool = False) -> None:
        super().__init__(message)
        self.loading = loading


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _port(text: str) -> int:
    """A port number; anything else is argparse's one line naming --port (`--port abc` said "invalid _port value")."""
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return int(text)


def run_server(main: Coroutine[Any, Any, None]) -> None:
    """On uvloop's event loop where it installs (not on Windows): libuv's sockets raised one process's max req/s
    against a zero-work upstream by 4% (1,778 -> 1,848 and 1,726 -> 1,795 req/s, interleaved runs)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
