"""Every backend's model list, kept in memory and refreshed in the background, so resolving a model never waits on
a backend that hangs.

A refresh asks every backend at once (one call in flight per backend) and waits only for the backends whose last
listing answered, each for at most `timeout`: a backend that hung or failed keeps its last good list and is
refreshed behind the requests' backs until it answers again: at once with the next round, and on its own after
`fresh_s`, doubling up to `every_s` (a backend slow at Velo's start, seen with a 1.5B model loading beside it,
had its models answered 404 until the next round a minute later). Refreshes for names nobody lists are rate-limited
(`fresh_s`), so a flood of unknown names costs one listing round, not one per request (seen before: each unknown
name re-listed every backend, 3 s per request with one hung backend).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from adapters.base import Backend
from adapters.protocol import ModelInfo

log = logging.getLogger("velo.router")
# The first listing at Velo's start may take longer than later ones: llama-server's probes /infill, a first prompt
# evaluation (3.5 s for Qwen2.5-Coder-1.5B on this machine under load, 0.4-0.8 s after), and a backend that is not
# listed in time has its models answered 404 until it is (seen in tests/integration/test_agent_quality.py).
START_S = 10.0


@dataclass
class Listing:
    models: list[ModelInfo] = field(default_factory=list)
    answered: bool = True  # the last refresh answered in time (until it has been asked, it is assumed to)
    task: asyncio.Task | None = None
    retry_s: float = 0.0  # after a failed listing: the wait before it is asked again on its own
    retry: asyncio.TimerHandle | None = None


class Listings:
    def __init__(self, backends: dict[str, Backend], timeout: float, every_s: float, fresh_s: float,
                 start_s: float = START_S) -> None:
        self.backends, self.timeout, self.start_s = backends, timeout, start_s
        self.every_s, self.fresh_s = every_s, fresh_s
        self.by_backend = {name: Listing() for name in backends}
        self.owner: dict[str, str] = {}  # model name -> backend name (the first backend that lists it)
        self.known_as: dict[str, str] = {}  # a server's own name for a model (ModelInfo.served_as) -> listed name
        self._asked = -float("inf")  # when a refresh round last started
        self._loop: asyncio.Task | None = None

    async def start(self) -> None:
        """The first round, each backend given `start_s` (Velo serves nothing before it anyway)."""
        await self.refresh(timeout=self.start_s)
        self._loop = asyncio.create_task(self._every())

    async def close(self) -> None:
        for entry in self.by_backend.values():
            if entry.retry is not None:
                entry.retry.cancel()
        tasks = [t for t in [self._loop, *(entry.task for entry in self.by_backend.values())] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def models(self) -> list[tuple[str, ModelInfo]]:
        """(backend name, model) in backend order."""
        return [(name, info) for name, entry in self.by_backend.items() for info in entry.models]

    async def refresh(self, *, unless_fresh: bool = False, timeout: float | None = None) -> None:
        """A listing round; with `unless_fresh`, none when one started less than `fresh_s` ago (nothing waited)."""
        now, timeout = time.monotonic(), timeout or self.timeout
        if unless_fresh and now - self._asked < self.fresh_s:
            return
        self._asked = now
        waits = [self._ask(name, timeout) for name, entry in self.by_backend.items() if entry.answered]
        for name, entry in self.by_backend.items():
            if not entry.answered:
                self._ask(name, timeout)  # runs on in the background; its answer is used once it comes
        if waits:
            await asyncio.wait([asyncio.shield(t) for t in waits], timeout=timeout)

    def _ask(self, name: str, timeout: float | None = None) -> asyncio.Task:
        entry = self.by_backend[name]
        if entry.task is None or entry.task.done():
            entry.task = asyncio.create_task(self._list_one(name, timeout or self.timeout))
        return entry.task

    async def _list_one(self, name: str, timeout: float) -> None:
        entry = self.by_backend[name]
        if entry.retry is not None:
            entry.retry.cancel()
        try:
            entry.models = await asyncio.wait_for(self.backends[name].list_models(), timeout)
            entry.answered, entry.retry_s = True, 0.0
        except Exception as e:  # noqa: BLE001 - one backend down must not hide the others' models
            entry.answered = False
            entry.retry_s = min(self.every_s, max(self.fresh_s, 2 * entry.retry_s))
            entry.retry = asyncio.get_running_loop().call_later(entry.retry_s, self._ask, name)
            why = f"did not answer within {timeout:g}s" if isinstance(e, asyncio.TimeoutError) else f"failed ({e})"
            log.warning("listing models of backend %r %s; its last list is kept, asked again in %gs", name, why,
                        entry.retry_s)
        self._index()

    def _index(self) -> None:
        owner: dict[str, str] = {}
        known_as: dict[str, str] = {}
        for name, info in self.models():
            owner.setdefault(info.name, name)
            for own in info.served_as:
                known_as.setdefault(own, info.name)
        self.owner, self.known_as = owner, known_as

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.refresh()
