"""One configuration in force: its config, backends, router and pipeline, built together. A request pins the
generation current when it arrives and runs on it to its end, so a reload (proxy/reload.py) never changes the
rules under a request in flight: the new generation becomes current at once, and the old one closes once its last
request is done. What did not change between them (a backend's table, the cache settings, ...) is the same object
in both, through the app's `Keep` (proxy/keep.py): an engine whose table did not change keeps its loaded model.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import AsyncIterator

from aiohttp import web

from adapters.base import Backend, start_all
from adapters.swaps import Swaps

from .config import Config
from .keep import Keep, Lease, fingerprint
from .pipeline import Pipeline
from .presets import PresetStore
from .router import Router

log = logging.getLogger("velo.generation")


@dataclass(eq=False)
class Generation:
    number: int
    config: Config
    backends: dict[str, Backend]
    router: Router
    pipeline: Pipeline
    lease: Lease
    fresh: list[Backend]  # made for this generation (the others are kept from the previous one, already open)
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    @classmethod
    def build(cls, number: int, config: Config, keep: Keep, given: dict[str, Backend] | None = None) -> "Generation":
        """Backends come from the keep when their table is unchanged, else are made (or taken from `given`, tests'
        ready-made backends). A build that fails gives back what it took."""
        lease = keep.lease()
        try:
            return cls._made(number, config, lease, given)
        except BaseException:
            lease.let_go()
            raise

    @classmethod
    def _made(cls, number: int, config: Config, lease: Lease, given: dict[str, Backend] | None) -> "Generation":
        from adapters.registry import make_backend  # only configured kinds import their adapters
        swaps, _ = lease.hold("llamacpp:swaps", Swaps)  # llama-servers Velo runs, across generations
        made = given if given is not None else {b.name: b for b in config.backends}
        backends, fresh = {}, []
        for name, made_or_cfg in made.items():
            cfg = made_or_cfg.config if isinstance(made_or_cfg, Backend) else made_or_cfg
            backend, new = lease.hold(f"backend:{name}:{fingerprint(cfg)}",
                                      lambda m=made_or_cfg: m if isinstance(m, Backend) else make_backend(m, swaps),
                                      _close_backend)
            backends[name] = backend
            if new:
                fresh.append(backend)
        path = config.presets.file()
        presets, _ = lease.hold(f"presets:{path}", lambda: PresetStore(path), _close_presets)
        router = Router(config, backends, presets=presets)
        return cls(number, config, backends, router, Pipeline(config, router, lease), lease, fresh)

    async def start(self) -> None:
        """New backends open first, then their model lists, then the stages that ask them things (slots) or load
        models (semantic cache). On failure, what this generation took is given back, so a refused reload leaves
        nothing behind."""
        try:
            await start_all(self.fresh)
            await self.router.start()  # the backends' model lists, kept and refreshed (proxy/listings.py)
            await self.router.presets.open()
            await self.pipeline.start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self.pipeline.close()
        await self.router.close()
        await self.lease.give_back()

    async def health(self) -> dict[str, bool]:
        """Each backend's health probe, 2 s at most each."""
        names = list(self.backends)
        return dict(zip(names, await asyncio.gather(*(_healthy(self.backends[n]) for n in names))))

    def enter(self) -> None:
        self.in_flight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()


async def _close_backend(backend: Backend) -> None:
    await backend.close()


async def _close_presets(presets: PresetStore) -> None:
    await presets.close()


async def _healthy(backend: Backend) -> bool:
    try:
        return await asyncio.wait_for(backend.health(), 2.0)
    except Exception:  # noqa: BLE001 - a health probe reports, it does not raise
        return False


class Generations:
    """The current generation, and the old ones still finishing their requests."""

    def __init__(self, first: Generation) -> None:
        self.current = first
        self.retiring: set[asyncio.Task] = set()
        self._left: list[Backend] = []  # backends of closed generations whose model load still runs in a thread

    def swap(self, new: Generation) -> Generation:
        old, self.current = self.current, new
        task = asyncio.create_task(self._retire(old))
        self.retiring.add(task)
        task.add_done_callback(self.retiring.discard)
        return old

    async def _retire(self, old: Generation) -> None:
        await old.idle.wait()
        await old.close()
        self.closed(old)
        log.info("configuration %d closed (its last request finished)", old.number)

    def closed(self, generation: Generation) -> None:
        """Remembers the model loads a closed generation (retired, or a reload's that never came into force) left
        running in a thread: an engine closed while it loads does not wait for its load, which nothing stops."""
        self._left = [backend for backend in (*self._left, *generation.backends.values()) if backend.loading]

    @property
    def loading(self) -> bool:
        """Whether a model's load runs in a thread, the current generation's or a closed one's: the process's exit
        waits for it."""
        return any(backend.loading for backend in (*self.current.backends.values(), *self._left))

    async def close(self) -> None:
        """At shutdown: the old generations once done, then the current one."""
        await asyncio.gather(*self.retiring, return_exceptions=True)
        await self.current.close()

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """`cleanup_ctx`: the first generation opens with the app and everything closes with it."""
        await self.current.start()
        yield
        await self.close()

