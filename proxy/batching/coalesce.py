"""Single-flight: identical in-flight requests share one backend stream.

Only the pipeline knows whether two requests are "identical" (same cache key, deterministic sampling), so it
passes the key. A flight lives from its first caller until the stream ends or its last caller leaves; requests
arriving after that start a new flight (caching finished answers is the cache's job, not this one).
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from adapters.errors import BackendError
from adapters.protocol import Chunk

from ..keep import Tally

ChunkFactory = Callable[[], AsyncIterator[Chunk]]
Bill = Callable[["list[Chunk] | None", "list[Chunk] | None"], None]


@dataclass
class _Flight:
    """One shared backend stream: every chunk so far, and an event swapped each time something changes; who pays
    for the call (its first caller, until it leaves before the end), who may take that over, first come first, and
    whether a caller got the whole answer."""

    chunks: list[Chunk] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    callers: int = 0
    payer: object = None
    paid: list[Chunk] | None = None  # what the last caller that paid for the call before the payer got, if any
    heirs: dict[object, Bill] = field(default_factory=dict)
    whole: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task | None = None

    def left(self, seen: int, bill: Bill) -> None:
        """The payer left before the end, having got `seen` chunks: the first caller still there pays for the
        rest; where none is, and one that has gone got the whole answer (the call is done), the payer does."""
        if self.heirs:
            self.payer, self.paid = next(iter(self.heirs)), self.chunks[:seen]
            self.heirs.pop(self.payer)(self.paid, None)
        elif self.whole:
            bill(self.paid, self.chunks)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass
class Coalescer:
    """`stream(key, factory)` runs `factory()` once per key in flight and fans its chunks out to every caller;
    `coalesced` counts the requests that joined a flight, in `joined` (which may outlive it)."""

    joined: Tally = field(default_factory=Tally)
    _flights: dict[str, _Flight] = field(default_factory=dict)

    @property
    def coalesced(self) -> int:
        return self.joined.n

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    async def stream(self, key: str, factory: ChunkFactory, joined: Callable[[], None] = lambda: None,
                     own: Callable[[Chunk], Chunk] = lambda chunk: chunk,
                     bill: Bill = lambda paid, upto: None) -> AsyncIterator[Chunk]:
        """Every chunk of the shared stream, from the first; the flight's error, if any, is raised here too.
        `joined` is called when the caller rides on a flight another started, and each chunk reaches that caller
        through `own`: what in an answer is one client's alone (its tool calls' ids) is made anew for each.
        The caller that started the flight pays for it, for what it gets, unless `bill(paid, upto)` says otherwise:
        that it pays for the call's chunks past `paid` (None: from the start, as no one paid for any) up to `upto`
        (None: to what it gets). Where the payer leaves before the end, the first caller still there pays for the
        rest (`paid`: what the payer got); where none is left, and one got the whole answer, the payer pays for the
        rest of it.

        Callers should close this generator (`contextlib.aclosing`) when they stop early, so that the backend
        call is cancelled as soon as the last of them is gone.
        """
        flight = self._flights.get(key)
        follower, me = flight is not None, object()
        if follower:
            self.joined.n += 1
            joined()
            flight.heirs[me] = bill
        else:
            flight = self._flights[key] = _Flight(payer=me)
            flight.pump = asyncio.create_task(self._pump(key, flight, factory), name=f"coalesce:{key[:32]}")
        flight.callers += 1
        seen, ended = 0, False
        try:
            while True:
                while seen < len(flight.chunks):
                    seen += 1
                    yield own(flight.chunks[seen - 1]) if follower else flight.chunks[seen - 1]
                if flight.done:
                    break
                await flight.changed.wait()
            ended = True
            if flight.error is not None:
                raise flight.error
            flight.whole = True
        finally:
            flight.callers -= 1
            flight.heirs.pop(me, None)
            if flight.payer is me and not ended:
                flight.left(seen, bill)
            if flight.callers == 0 and not flight.done:
                await self._abandon(key, flight)

    async def _pump(self, key: str, flight: _Flight, factory: ChunkFactory) -> None:
        """Copies the backend stream into the flight; runs in its own task so no single caller owns it."""
        try:
            stream = factory()
            try:
                async for chunk in stream:
                    flight.chunks.append(chunk)
                    flight.notify()
            finally:
                with contextlib.suppress(Exception):
                    await stream.aclose()
        except asyncio.CancelledError:  # by _abandon (no caller left), or from outside (a shutdown): never a whole
            flight.error = BackendError("the shared backend call was cancelled")  # answer, nor one to cache
            raise
        except Exception as e:  # every caller re-raises it
            flight.error = e
        finally:
            flight.done = True
            if self._flights.get(key) is flight:
                del self._flights[key]
            flight.notify()

    async def _abandon(self, key: str, flight: _Flight) -> None:
        """The last caller left before the end: cancel the backend call and wait until it is closed."""
        if self._flights.get(key) is flight:
            del self._flights[key]
        assert flight.pump is not None
        flight.pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(flight.pump)
