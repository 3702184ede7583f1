"""How long each model stays loaded, as Ollama's `keep_alive` says: every request (any dialect, embeddings too)
sets its model's stay to its own `keep_alive` (Ollama's default: 5 minutes) from the moment it ends; `/api/ps`
shows that as `expires_at`, and for backends whose model Velo itself loads (the engine: `Backend.idle_unload`) a
timer unloads the model once the stay runs out with no request in flight. `keep_alive: 0` unloads at the end of
the request (at once for a bare load request). Ollama backends get `keep_alive` with the request and expire their
models themselves.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from adapters import keep_alive
from adapters.base import Backend
from adapters.errors import ModelNotFound
from adapters.protocol import KEPT_LOADED_S, rfc3339

from .router import Target

log = logging.getLogger("velo.residency")


@dataclass
class Stay:
    keep_s: float = keep_alive.DEFAULT_S
    last_used: float = field(default_factory=time.time)
    in_flight: int = 0
    unloading: bool = False  # keep_alive 0 came while requests ran: unloaded when they are done (Ollama's way)

    @property
    def expires(self) -> float:
        return math.inf if self.in_flight or math.isinf(self.keep_s) else self.last_used + self.keep_s


class Residency:
    def __init__(self) -> None:
        self.stays: dict[tuple[str, str], tuple[Target, Stay]] = {}
        # unloads held back for requests in flight on a backend that unloads for itself, sent by the timer once
        # they are done: only Velo's timer unloads later, so without it the unload was never sent
        self.owed: dict[tuple[str, str], Target] = {}
        self._wake = asyncio.Event()
        self._timer: asyncio.Task | None = None

    def _stay(self, target: Target) -> Stay:
        """The model's stay, kept with the newest target: after a config reload, the backend object in force."""
        key = _key(target)
        stay = self.stays[key][1] if key in self.stays else Stay()
        self.stays[key] = (target, stay)
        return stay

    @contextlib.contextmanager
    def use(self, target: Target, keep: Any) -> Iterator[None]:
        """Around one request: its model is not unloaded under it, and stays `keep` after it. The unload timer
        watches backends whose model Velo unloads itself, so their requests wake it; another backend's wakes it only
        to send an unload its requests held back (`owed`)."""
        stay = self._stay(target)
        stay.in_flight += 1
        try:
            yield
        except ModelNotFound:
            if stay.in_flight == 1:  # a name the backend does not serve (Ollama's 404) stays nowhere
                del self.stays[_key(target)]
            raise
        finally:
            stay.in_flight -= 1
            stay.last_used = time.time()
            keep = target.backend.default_keep_alive if keep is None else keep
            stay.keep_s = 0.0 if stay.unloading else keep_alive.seconds(keep)
            owed, stay.unloading = stay.unloading and not stay.in_flight, stay.unloading and stay.in_flight > 0
            if target.backend.idle_unload:
                self._wake.set()
            elif not stay.in_flight and self.stays.get(_key(target), (None, None))[1] is stay:
                # a backend that unloads for itself needs its stay only while requests run: kept, every name a
                # client made up (answered by a backend that takes any name, or refused by a later stage) stayed
                del self.stays[_key(target)]
                if owed:
                    self.owed[_key(target)] = target
                    self._wake.set()

    async def adopt(self, backends: Iterable[Backend]) -> None:
        """Models loaded before any request (the engine loads its model as Velo starts) stay their backend's
        default `keep_alive` from now, as after a request: without a stay, /api/ps said "kept forever" and the model
        held its memory until a request came and went. A stay of another backend under the name (the one a reload
        replaced, which unloads as it closes) is not this model's."""
        for backend in backends:
            if not backend.idle_unload:
                continue
            for model in await backend.running():
                key = (backend.name, model.name)
                if key not in self.stays or self.stays[key][0].backend is not backend:
                    self.stays[key] = (Target(backend, model.name),
                                       Stay(keep_s=keep_alive.seconds(backend.default_keep_alive)))
        self._wake.set()

    async def load(self, target: Target, keep: Any) -> int:
        """A bare load request (no prompt): nanoseconds spent loading."""
        with self.use(target, keep):
            return await target.backend.load(target.model, keep)

    async def unload(self, target: Target) -> None:
        """`keep_alive: 0` with no prompt: unloaded now, or as soon as the requests in flight are done."""
        if not self.unload_after(target):
            self.stays.pop(_key(target), None)
            await target.backend.unload(target.model)

    def unload_after(self, target: Target) -> bool:
        """Whether requests run on the model: then it is unloaded once they are done, and this says True."""
        held = self.stays.get(_key(target))
        if held is None or not held[1].in_flight:
            return False
        stay = held[1]
        stay.keep_s, stay.last_used, stay.unloading = 0.0, time.time(), True
        return True

    def expires_at(self, backend: str, model: str) -> str | None:
        """RFC 3339 time the model is due to unload, as /api/ps says it; None when no request used it yet."""
        held = self.stays.get((backend, model))
        if held is None:
            return None
        expires = held[1].expires
        return rfc3339(time.time() + KEPT_LOADED_S if math.isinf(expires) else expires)

    async def start(self) -> None:
        """Its unload timer, once: each configuration that holds it starts it."""
        if self._timer is None:
            self._timer = asyncio.create_task(self._expire_forever())

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer

    async def _expire_forever(self) -> None:
        while True:
            self._wake.clear()  # before the work: a request that ends during an unload wakes the next round
            while self.owed:
                await self._unload(self.owed.pop(next(iter(self.owed))))
            now = time.time()
            mine = [(t, s) for t, s in self.stays.values() if t.backend.idle_unload]
            for target, stay in mine:
                # still this stay: an unload while the loop awaited another may have ended it, and a request since
                # begun another under the same key
                if stay.expires <= now and self.stays.get(_key(target), (None, None))[1] is stay:
                    del self.stays[_key(target)]
                    await self._unload(target)
            soonest = min((s.expires for t, s in mine if s.expires > now), default=math.inf) - time.time()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the cancel that close() sends
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if math.isinf(soonest) else max(soonest, 0.05)):
                    await self._wake.wait()

    async def _unload(self, target: Target) -> None:
        try:
            await target.backend.unload(target.model)
        except Exception:  # noqa: BLE001 - a failed unload leaves the model loaded, nothing worse
            log.exception("unloading %s from %r failed", target.model, target.backend.name)


def _key(target: Target) -> tuple[str, str]:
    return target.backend.name, target.model
