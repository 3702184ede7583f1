"""config.toml read again without a restart: on SIGHUP (`velo serve` wires it) or when the file's modification time
or size changes (polled, like llama-swap's `--watch-config`), once it has stopped changing. A config that loads and
whose new backends open becomes the current generation (proxy/generation.py); one that does not is refused, its
error in the log, and the one in force stays. Requests in flight finish on the generation they started on.

What a generation cannot change (the listening address, the body limit, the header timeout, the browser origins,
the shutdown grace, the responses store) is logged as needing a restart.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path
from typing import AsyncIterator, Iterator

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from adapters.base import BackendConfig
from adapters.wording import counted

from .config import Config, load_config
from .default_backend import default_config
from .generation import Generation, Generations
from .keep import Keep, fingerprint

log = logging.getLogger("velo.reload")
_PASSWORD = re.compile(r"(//[^/@\s:'\"]*:)[^@\s'\"]*@")  # scheme://user:PASSWORD@host
RESTART_ONLY = ("server.host", "server.port", "server.max_body_bytes", "server.header_timeout_s", "server.origins",
                "server.shutdown_grace_s", "responses")


# An edited file is read once it has not changed for this long: an editor that truncates the file and then writes
# it (VS Code, vim with backupcopy=yes) leaves it empty or cut for a moment, and a poll that fell there read that:
# an empty file switched every request to the default backend, a cut one was refused, until the next poll.
SETTLE_S = 0.3


class Reloader:
    def __init__(self, path: str | Path, generations: Generations, keep: Keep, interval_s: float = 1.0,
                 settle_s: float = SETTLE_S) -> None:
        self.path, self.generations, self.keep = Path(path), generations, keep
        self.interval_s, self.settle_s = interval_s, settle_s
        self.applied = self.refused = self.cancelled = 0
        self.last_error = ""
        self._version = _version(self.path)  # the file the config in force was read from (read before serving)
        # what the file says of the restart-only keys: a change is one of the file's, not of `velo serve --port`
        read = generations.current.config if self._version is None else load_config(self.path)
        self._restart_only = _restart_only(read)
        # a file that names no backends is served by the default (proxy/default_backend.py), which its edits keep
        in_force = generations.current.config
        self._default: tuple[list[BackendConfig], str | None] | None = \
            None if read.backends else (in_force.backends, in_force.default_backend)
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._waiting = False  # a reload is asked for and has not read the file yet
        self._watcher: asyncio.Task | None = None

    def trigger(self) -> None:
        """For a signal handler: reload soon, on the event loop. Signals that come while a reload waits to read the
        file are that reload's (a burst of 5 SIGHUPs built 5 generations, each opening the changed backends)."""
        if self._waiting:
            return
        self._waiting = True
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> bool:
        """True when the file's config is now in force; False (and the old one stays) when it was refused. One that
        Velo's stop cancels is logged and counted too: it ended without a word, the edit never in force."""
        try:
            async with self._lock:
                return await self._reload()
        except asyncio.CancelledError:
            self.cancelled += 1
            log.warning("config reload cancelled, configuration %d stays in force: Velo is stopping",
                        self.generations.current.number)
            raise

    async def _reload(self) -> bool:
        """`reload()`'s work, under its lock."""
        self._waiting = False  # what the file says from here on, this reload reads
        self._version = await asyncio.to_thread(_version, self.path)
        old = self.generations.current
        try:
            read = await asyncio.to_thread(load_config, self.path)
            if not read.backends:  # as a start with this file: an edit that dropped them served no model
                if self._default is None:
                    made = await default_config()
                    self._default = made.backends, made.default_backend
                read.backends, read.default_backend = self._default
            config, self._restart_only = _keep_restart_only(old.config, read, self._restart_only)
            new = Generation.build(old.number + 1, config, self.keep)
            await self._started(new)
        except Exception as e:  # noqa: BLE001 - any failure refuses the new config; the old one serves on
            self.refused += 1
            self.last_error = str(e)
            log.error("config reload refused, configuration %d stays in force: %s", old.number, e)
            return False
        self.generations.swap(new)
        self.applied += 1
        self.last_error = ""
        log.info("configuration %d from %s is in force (%s, %d kept open)", new.number, self.path,
                 counted(len(new.backends), "backend"), len(new.backends) - len(new.fresh))
        return True

    async def _started(self, new: Generation) -> None:
        """`new.start()`, which closes what it made when it fails or is cancelled (Velo stopping); a load that
        still runs in a thread then is the generations' to know of (Ctrl-C during one waited for all of it)."""
        try:
            await new.start()
        except BaseException:
            self.generations.closed(new)
            raise

    def stop(self) -> None:
        """At Velo's stop: no more reloads, and the one under way is cancelled (what it started, closed) rather than
        loading on through the shutdown's grace."""
        for task in (self._watcher, *self._tasks):
            if task is not None:
                task.cancel()

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            seen = await asyncio.to_thread(_version, self.path)
            if seen == self._version:
                continue
            while True:  # until the file stays as it is for settle_s
                await asyncio.sleep(self.settle_s)
                now = await asyncio.to_thread(_version, self.path)
                if now == seen:
                    break
                seen = now
            await self.reload()

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """`cleanup_ctx`: watches the file while the app runs."""
        self._watcher = asyncio.create_task(self.watch())
        yield
        self.stop()
        await asyncio.gather(self._watcher, *self._tasks, return_exceptions=True)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        reloads = CounterMetricFamily("velo_config_reloads", "Config reloads by outcome", labels=["outcome"])
        reloads.add_metric(["applied"], self.applied)
        reloads.add_metric(["refused"], self.refused)
        reloads.add_metric(["cancelled"], self.cancelled)
        yield reloads
        yield GaugeMetricFamily("velo_config_generation", "Number of the configuration in force",
                                value=self.generations.current.number)


def _version(path: Path) -> tuple[int, int] | None:
    """The file's modification time and size: a write within the clock's tick (a coarse one) still changes its size."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size


def _restart_only(config: Config) -> dict[str, object]:
    return {key: getattr(_at(config, key.split(".")[:-1]), key.split(".")[-1]) for key in RESTART_ONLY}


def _keep_restart_only(old: Config, new: Config, read_before: dict[str, object]) -> tuple[Config, dict[str, object]]:
    """`new` with the values in force for what only a restart changes (so the config in force says what is
    true), a warning for each one the file changed since it was read last (a `--port` given to `velo serve` is
    no change of the file's: it warned at every reload), and what the file says of them now."""
    read = _restart_only(new)
    for key in RESTART_ONLY:
        *parents, name = key.split(".")
        if fingerprint(read[key]) != fingerprint(read_before[key]):
            log.warning("%s changed (%s -> %s): it takes effect when Velo restarts", key, _shown(read_before[key]),
                        _shown(read[key]))
        setattr(_at(new, parents), name, getattr(_at(old, parents), name))
    return new, read


def _shown(value: object) -> str:
    """`value`'s repr without the passwords of the URLs in it ([responses] redis_url)."""
    return _PASSWORD.sub(r"\1***@", repr(value))


def _at(config: Config, parts: list[str]) -> object:
    value: object = config
    for part in parts:
        value = getattr(value, part)
    return value
