"""`velo serve`: load config.toml (or pick the embedded default) and serve on :8000.
`velo doctor`, `velo bench` and `velo chat` live in proxy/commands/."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Any, Coroutine

import aiohttp
from aiohttp import web

from adapters.base import BackendConfig

from .app import make_app
from .commands import bench, chat, doctor
from .config import Config, ConfigError, load_config
from .inflight import InFlight, ShuttingDown
from .request_bounds import server_options
from .state import GENERATIONS, RELOADER

log = logging.getLogger("velo")
OLLAMA_DEFAULT_URL = "http://127.0.0.1:11434"
_AFTER_ENDING_S = 2.0  # for ended requests to write their error events, and for aiohttp's own shutdown


async def ollama_running(url: str = OLLAMA_DEFAULT_URL, timeout: float = 0.5) -> bool:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(f"{url}/api/version") as r:
                return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


async def default_config() -> Config:
    """No config file: a local Ollama if one answers, else Velo's engine with the model shipped on PyPI."""
    if await ollama_running():
        log.info("no config: using the Ollama at %s", OLLAMA_DEFAULT_URL)
        backend = BackendConfig(name="ollama", kind="ollama", urls=[OLLAMA_DEFAULT_URL])
    else:
        log.info("no config and no Ollama: starting the embedded engine with the shipped SmolLM2-135M")
        backend = BackendConfig(name="engine", kind="engine")
    return Config(backends=[backend], default_backend=backend.name)


def find_config(explicit: str | None) -> Path | None:
    for candidate in (explicit, os.environ.get("VELO_CONFIG"), "config.toml"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
        if candidate == explicit and explicit:
            raise ConfigError(f"config file {explicit} not found")
    return None


async def serve(config: Config, stop: asyncio.Event | None = None, config_path: Path | None = None) -> None:
    """Serves until SIGINT/SIGTERM (or `stop` is set), then shuts down gracefully: the listening socket closes
    and idle connections are told to close, in-flight requests get `server.shutdown_grace_s` to finish, those
    still running are ended with their dialect's error (a stream's error event; 503 "shutting down"), which
    cancels their backend work, and only then are the backends closed (before, aiohttp's own shutdown waited
    twice the grace and then cut streams with no error event). With `config_path`, SIGHUP or an edit of that file
    reloads the configuration (proxy/reload.py)."""
    app = make_app(config, config_path=config_path)
    runner = web.AppRunner(app, handler_cancellation=True,  # a client that leaves cancels its handler
                           shutdown_timeout=_AFTER_ENDING_S, **server_options(config.server))
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.port)
    await site.start()
    log.info("Velo listening on http://%s:%d", config.server.host, config.server.port)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if config_path is not None:
        loop.add_signal_handler(signal.SIGHUP, app[RELOADER].trigger)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await _shut_down(runner, app[GENERATIONS].current.pipeline.inflight,
                         config.server.shutdown_grace_s)


async def _shut_down(runner: web.AppRunner, inflight: InFlight, grace: float) -> None:
    log.info("shutting down: finishing in-flight requests (up to %gs)", grace)
    for site in list(runner.sites):
        await site.stop()
    assert runner.server is not None
    runner.server.pre_shutdown()  # kept-alive connections take no new request
    if not await inflight.drained(grace):
        ended = inflight.cancel_all(ShuttingDown("Velo is shutting down; send the request again"))
        log.warning("%d requests outlived the grace period of %gs and were ended", ended, grace)
        await inflight.drained(_AFTER_ENDING_S)
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="velo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="run the proxy")
    serve_p.add_argument("--config", help="path to config.toml (default: $VELO_CONFIG, ./config.toml)")
    serve_p.add_argument("--host")
    serve_p.add_argument("--port", type=int)
    serve_p.add_argument("--log-level", default="INFO")
    for command in (doctor, bench, chat):
        command.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command != "serve":
        return args.func(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        path = find_config(args.config)
        config = load_config(path) if path else asyncio.run(default_config())
    except ConfigError as e:
        parser.exit(2, f"velo: config error: {e}\n")
    config.server.host = args.host or config.server.host
    config.server.port = args.port or config.server.port
    run_server(serve(config, config_path=path))
    return 0


def run_server(main: Coroutine[Any, Any, None]) -> None:
    """On uvloop's event loop where it installs (not on Windows): libuv's sockets raised one process's max req/s
    against a zero-work upstream by 4% (1,778 -> 1,848 and 1,726 -> 1,795 req/s, interleaved runs)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
