"""Which managed llama-servers run (adapters/llamacpp_managed.py), as llama-swap decides it: a server starts on the
first request for its model; it may start only while fewer than its `max_loaded` managed servers run (1: it runs
alone); to make room, idle servers stop, least recently used first, and a busy one is drained: it takes no new
requests, its streams in flight finish, then it stops. Nothing in flight is ever cut. One `Swaps` per app.

A request waits for room and for the start together at most its backend's `first_token_timeout` (then a 504: a
drained server's stream may run for long), and may leave at any time (client gone, admin cancel): the start runs
in a task of its own, so the request that happened to ask first never takes the start down for the others.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, AsyncIterator

from .errors import BackendTimeout

if TYPE_CHECKING:
    from .llamacpp_managed import ManagedLlamaCpp


class Swaps:
    def __init__(self) -> None:
        self.servers: list[ManagedLlamaCpp] = []  # every managed server, running or not
        self._changed = asyncio.Condition()

    def add(self, server: ManagedLlamaCpp) -> None:
        self.servers.append(server)

    def remove(self, server: ManagedLlamaCpp) -> None:
        self.servers.remove(server)

    @asynccontextmanager
    async def use(self, server: ManagedLlamaCpp) -> AsyncIterator[None]:
        """Holds `server` running for the block: waits (in line, counted in `server.stats.waiting`) for room, has it
        started if it is not up, and lets it idle (then stop after its ttl_s) when the last user leaves."""
        waited, limit, admitted = time.monotonic(), server.config.first_token_timeout, False
        server.stats.waiting += 1
        try:
            try:
                async with asyncio.timeout(limit):
                    await self._admit(server)
                    admitted = True
                    await server.ready()
            except asyncio.TimeoutError as e:
                why = "its start is still under way" if admitted else (
                    f"no room: {server.max_loaded} managed server(s) may run and the others are busy")
                raise BackendTimeout(f"backend {server.name!r}: llama-server for {server.model_name} was not ready "
                                     f"within {limit:g}s ({why})") from e
            finally:
                server.stats.waiting -= 1
            server.stats.wait_s += time.monotonic() - waited
            yield
        finally:
            if admitted:
                await self._release(server)

    async def _release(self, server: ManagedLlamaCpp) -> None:
        async with self._changed:
            server.users -= 1
            server.last_used = time.monotonic()
            if server.users == 0:
                server.idle()
            self._changed.notify_all()

    async def _admit(self, server: ManagedLlamaCpp) -> None:
        """Counts the caller as a user of `server`, starting it when it is down and there is room."""
        async with self._changed:
            while True:
                if server.state in ("starting", "ready") and not server.draining:
                    server.take()
                    return
                if server.state == "stopped":
                    others = [s for s in self.servers if s is not server and s.state != "stopped"]
                    # every running server's own limit too: one with max_loaded 1 ran beside a later one with 2
                    if len(others) < min([server.max_loaded, *(s.max_loaded for s in others)]):
                        server.starting()
                        server.take()
                        server.launching = asyncio.get_running_loop().create_task(self._start(server))
                        return
                    self._make_room(others)
                await self._changed.wait()

    def _make_room(self, others: list[ManagedLlamaCpp]) -> None:
        """Stops the least recently used idle server, or drains the least recently used busy one."""
        if any(s.state in ("stopping", "starting") or s.draining for s in others):
            return  # room is being made already
        idle = sorted((s for s in others if s.users == 0 and s.state == "ready"), key=lambda s: s.last_used)
        victim = idle[0] if idle else min(others, key=lambda s: s.last_used)
        victim.stats.swaps += 1
        if victim.users == 0:
            victim.stop_soon()
        else:
            victim.draining = True  # stopped by `use` when its last stream ends

    async def _start(self, server: ManagedLlamaCpp) -> None:
        """The start, in a task of its own; its outcome reaches the requests through `server.ready()`."""
        try:
            await server.launch()
        except BaseException:
            async with self._changed:
                server.state = "stopped"
                self._changed.notify_all()
            return  # `launch` gave the error to `server.ready()`, where every waiting request raises it
        async with self._changed:
            server.state = "ready"
            if server.users == 0:  # everyone who asked left during the start: it idles from now on
                server.idle()
            self._changed.notify_all()

    async def unload(self, server: ManagedLlamaCpp) -> None:
        """Ollama's `keep_alive: 0`: `server` stops now, or once its streams in flight are done (drained)."""
        async with self._changed:
            if server.state != "ready" or server.draining:
                return
            if server.users:
                server.draining = True
            else:
                server.stop_soon()

    async def stopped(self, server: ManagedLlamaCpp) -> None:
        """Called by a server once its process is gone: room for the next."""
        async with self._changed:
            server.state, server.draining = "stopped", False
            self._changed.notify_all()
