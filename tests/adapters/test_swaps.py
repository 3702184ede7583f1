"""Waiting for a managed llama-server (adapters/swaps.py) under faults: the wait is bounded, a request may leave
at any moment, and the one that asked first leaving never takes the start down for the others. The servers here
start in a scripted time instead of running llama-server (tests/integration/test_managed_llama.py runs it)."""
from __future__ import annotations

import asyncio

import pytest

from adapters.base import BackendConfig
from adapters.errors import BackendTimeout, BackendUnavailable
from adapters.llamacpp_managed import ManagedLlamaCpp
from adapters.protocol import ModelInfo
from adapters.swaps import Swaps


class Scripted(ManagedLlamaCpp):
    """A managed server whose start takes `start_s` and runs no process."""

    def __init__(self, name: str, swaps: Swaps, start_s: float = 0.0, wait_s: float = 60.0,
                 ttl_s: float = 0.0, max_loaded: int = 1) -> None:
        super().__init__(BackendConfig(name=name, kind="llamacpp", model=f"/models/{name}.gguf", ttl_s=ttl_s,
                                       first_token_timeout=wait_s, max_loaded=max_loaded), swaps)
        self.start_s = start_s
        self.fails = 0  # starts still to fail

    async def _run(self) -> None:
        await asyncio.sleep(self.start_s)
        if self.fails:
            self.fails -= 1
            raise BackendUnavailable(f"{self.name} could not start")
        self.stats.starts += 1

    async def show(self, model: str):  # noqa: ANN201 - the file is made up: its model as named
        return ModelInfo(name=model)

    def _has_model_file(self) -> bool:  # made up, as its program is
        return True

    def _has_program(self) -> bool:
        return True


async def hold(server: ManagedLlamaCpp, release: asyncio.Event) -> None:
    async with server.swaps.use(server):
        await release.wait()


async def until(condition, seconds: float = 5.0) -> None:  # noqa: ANN001
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met")


async def test_waiting_for_room_behind_a_busy_server_is_bounded():
    """Before: a request for another model waited for as long as the busy server's stream ran (a runaway
    generation: for ever)."""
    swaps, release = Swaps(), asyncio.Event()
    busy, other = Scripted("busy", swaps), Scripted("other", swaps, wait_s=0.3)
    streaming = asyncio.create_task(hold(busy, release))
    await until(lambda: busy.state == "ready" and busy.users == 1)
    with pytest.raises(BackendTimeout, match=r"'other'.*not ready within 0.3s \(no room"):
        async with swaps.use(other):
            pass
    assert other.stats.waiting == 0 and other.state == "stopped" and other.users == 0
    assert busy.state == "ready" and busy.users == 1  # the stream in flight is untouched
    release.set()
    await streaming
    await until(lambda: busy.state == "stopped")  # drained for `other`, then stopped once its stream ended
    for s in (busy, other):
        await s.close()


async def test_a_request_waiting_for_room_can_leave():
    swaps, release = Swaps(), asyncio.Event()
    busy, other = Scripted("busy", swaps), Scripted("other", swaps)
    streaming = asyncio.create_task(hold(busy, release))
    await until(lambda: busy.state == "ready")
    waiting = asyncio.create_task(hold(other, asyncio.Event()))
    await until(lambda: other.stats.waiting == 1)
    waiting.cancel()  # the client left, or an admin cancelled it (DELETE /velo/requests/{id})
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert other.stats.waiting == 0 and other.users == 0 and other.state == "stopped"
    release.set()
    await streaming
    for s in (busy, other):
        await s.close()


async def test_the_first_request_leaving_during_the_start_leaves_it_to_the_others():
    """Before: the start ran in the first request's task, so its client leaving failed every other request
    waiting for that server ("start cancelled")."""
    swaps = Swaps()
    server = Scripted("s", swaps, start_s=0.3)
    first = asyncio.create_task(hold(server, asyncio.Event()))
    await until(lambda: server.state == "starting")
    second_served = asyncio.Event()

    async def second() -> None:
        async with swaps.use(server):
            second_served.set()
    later = asyncio.create_task(second())
    await until(lambda: server.users == 2)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(later, 5)
    assert second_served.is_set() and server.stats.starts == 1
    await server.close()


async def test_a_slow_start_is_bounded_for_the_request_and_then_idles_to_its_ttl():
    """The request gives up after first_token_timeout; the start goes on, and with nobody left to use the server
    it stops after ttl_s as any idle one (before this, a start nobody waited for any more was never stopped)."""
    swaps = Swaps()
    server = Scripted("s", swaps, start_s=0.3, wait_s=0.1, ttl_s=0.2)
    with pytest.raises(BackendTimeout, match=r"not ready within 0.1s \(its start is still under way\)"):
        async with swaps.use(server):
            pass
    assert server.users == 0 and server.state == "starting" and server.stats.waiting == 0
    await until(lambda: server.state == "ready")
    await until(lambda: server.state == "stopped")
    assert server.stats.starts == 1
    await server.close()


async def test_a_server_that_runs_alone_is_stopped_for_one_that_would_run_beside_it():
    """Only the starting server's max_loaded was read: one with 2 started beside a running one with 1."""
    swaps, release = Swaps(), asyncio.Event()
    alone, other = Scripted("alone", swaps, max_loaded=1), Scripted("other", swaps, max_loaded=2)
    async with swaps.use(alone):
        pass
    async with swaps.use(other):
        assert alone.state == "stopped" and other.state == "ready"
    for s in (alone, other):
        await s.close()


async def test_keep_alive_0_stops_the_server_now_or_once_its_streams_are_done():
    """Ollama's keep_alive 0 answered "unload" and the server ran on; a bare load of a stopped one asked its dead
    port (a 503)."""
    swaps, release = Swaps(), asyncio.Event()
    server = Scripted("s", swaps)
    assert await server.load("s", None) >= 0 and server.state == "ready"
    await server.unload("s")
    await until(lambda: server.state == "stopped")
    await server.load("s", "10m")
    assert (await server.running())[0].expires_at
    streaming = asyncio.create_task(hold(server, release))
    await until(lambda: server.users == 1)
    await server.unload("s")
    assert server.state == "ready" and server.draining  # its stream in flight is not cut
    release.set()
    await streaming
    await until(lambda: server.state == "stopped")
    await server.close()


async def test_a_start_that_failed_once_leaves_the_server_healthy_once_one_succeeds():
    """The last start's error stayed, and /ready said false for good."""
    swaps = Swaps()
    server = Scripted("s", swaps)
    server.fails = 1
    with pytest.raises(BackendUnavailable):
        async with swaps.use(server):
            pass
    assert not await server.health()
    async with swaps.use(server):
        pass
    await server.unload("s")  # stopped, it is healthy while it can be started
    await until(lambda: server.state == "stopped")
    assert await server.health()
    await server.close()


async def test_a_request_that_fails_still_says_how_long_its_server_stays():
    """keep_alive was read only from a request that ended well: one that failed left the one before's in force."""
    from adapters.errors import BackendError
    from adapters.protocol import ChatRequest, Message
    swaps = Swaps()
    server = Scripted("s", swaps)
    with pytest.raises(BackendError):  # a scripted server runs no llama-server: the call itself fails
        [c async for c in server.chat(ChatRequest(model="s", messages=[Message("user", "hi")], keep_alive=0))]
    await until(lambda: server.state == "stopped")
    await server.close()
