"""Per-backend admission: a concurrency limit, a bounded priority queue, fairness, supersession, backpressure.

Local backends serve a few requests at once (llama-server slots, OLLAMA_NUM_PARALLEL) and slow down or fail when
oversubscribed. Velo holds the rest here, where it can order them: lower `priority` first (autocomplete/FIM is
latency-critical), then among clients at the same priority the one served least recently, and a newer autocomplete
from the same client replaces the older one, as IDEs expect. A request waits at most `queue_timeout_s` for its slot
(one with a place taken earlier, its place's `wait_s`): the backend's own timeouts start only once it runs, and a
queue behind hung slots held its requests until they freed. One timer per queue, at the earliest deadline of those
waiting, ends the waits: a timer per queued request (`asyncio.timeout`), most of them for requests whose slot comes
in milliseconds, was 1.3% of a short chat's instructions with 32 clients on 4 slots (2,114 -> 2,086 thousand,
`bench/proxy_instructions.py --clients 32`).
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator

from adapters.errors import Overloaded, VeloError

LATENCY_CRITICAL = 0  # autocomplete / fill-in-the-middle
NORMAL = 1
BACKGROUND = 2  # indexing, titles

# Clients whose last turn is remembered, per backend (~200 KB at 48-character names): one forgotten while its line
# waits was served (or queued) before every one kept, so it ranks first, where it belongs; one that asks again
# after it was forgotten ranks as a new one, as of then.
_CLIENTS_KEPT = 1024


class Superseded(VeloError):
    """A newer request with the same supersede key replaced this one; the edge closes it like nginx's 499."""

    status = 499
    kind = "request_superseded"


@dataclass(eq=False)
class _Ticket:
    priority: int
    client: str
    supersede_key: str | None
    granted: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Task | None = None  # set once running, so a supersession can interrupt it
    superseded: bool = False
    deadline: float = math.inf  # the loop's time its wait ends, once queued
    wait: tuple[float, str] = (math.inf, "")  # how long that is and which setting says so, for the error


@dataclass(eq=False)
class Place:
    """A place in a backend's queue, taken for a request that asks for its slot later (`reserve`)."""

    controller: AdmissionController
    wait_s: float  # how long its request may wait for its slot
    bound: str  # the setting that says so, for the error
    held: bool = True  # until the request takes it in `slot`, or gives it back


@dataclass
class AdmissionController:
    """`async with controller.slot(priority, client, supersede_key):` runs the body holding one of `limit` slots.

    Raises `Overloaded` (with `retry_after`) when `max_queue` requests already wait or a slot did not come within
    `queue_timeout_s`, and `Superseded` in a request that a newer one with the same `supersede_key` replaced, whether
    it was queued or running.
    """

    limit: int
    max_queue: int
    queue_timeout_s: float
    running: int = 0
    _queues: dict[int, dict[str, deque[_Ticket]]] = field(default_factory=dict)  # priority -> client -> its line
    # client -> its last turn, oldest first; for one never served, the turn when its line was made, so that a client
    # naming itself anew with each request joins the back (ranked first, new names starved everyone else)
    _served: OrderedDict[str, int] = field(default_factory=OrderedDict)
    _turns: int = 0
    _by_key: dict[str, _Ticket] = field(default_factory=dict)
    _queued: int = 0
    _reserved: int = 0  # places held for requests on their way (`reserve`)
    _mean_hold_s: float = 1.0  # moving average of slot hold times, for Retry-After
    _timer: asyncio.TimerHandle | None = None  # at the earliest deadline of those waiting, or before it

    def __post_init__(self) -> None:
        assert self.limit >= 1 and self.max_queue >= 0 and self.queue_timeout_s > 0

    @property
    def queued(self) -> int:
        return self._queued

    @asynccontextmanager
    async def slot(self, priority: int = NORMAL, client: str = "", supersede_key: str | None = None,
                   place: Place | None = None) -> AsyncIterator[None]:
        """`place`, where it is this queue's and still held, is the request's: it queues whatever came since."""
        ticket = _Ticket(priority, client, supersede_key)
        if supersede_key is not None:
            self._check_room(supersede_key)
            self._supersede(supersede_key, ticket)
        reserved = place if place is not None and place.controller is self and place.held else None
        if reserved is not None:
            self.give_back(reserved)
        try:
            await self._acquire(ticket, reserved)
        except BaseException:
            self._forget(ticket)
            raise
        if ticket.superseded:  # replaced between being granted the slot and resuming
            self._release()
            raise Superseded("a newer request from the same client replaced this one")
        ticket.task = asyncio.current_task()
        started = time.monotonic()
        try:
            yield
        except asyncio.CancelledError:
            if ticket.superseded and ticket.task is not None and ticket.task.uncancel() == 0:
                raise Superseded("a newer request from the same client replaced this one") from None
            raise
        finally:
            self._mean_hold_s += 0.2 * (time.monotonic() - started - self._mean_hold_s)
            self._forget(ticket)
            self._release()

    async def _acquire(self, ticket: _Ticket, place: Place | None) -> None:
        if place is None:
            self._room_behind(self._queued)
        if self.running < self.limit and self._queued == 0:
            self.running += 1
            self._grant(ticket)
            return
        if ticket.client not in self._served:
            self._mark(ticket.client)
        self._queues.setdefault(ticket.priority, {}).setdefault(ticket.client, deque()).append(ticket)
        self._queued += 1
        wait_s, bound = (place.wait_s, place.bound) if place else (self.queue_timeout_s, "[batching] queue_timeout_s")
        loop = asyncio.get_running_loop()
        ticket.deadline, ticket.wait = loop.time() + wait_s, (wait_s, bound)  # written out only if it times out
        if self._timer is None or ticket.deadline < self._timer.when():
            self._arm(loop, ticket.deadline)
        try:
            await ticket.granted
        except BaseException:
            if ticket.granted.done() and not ticket.granted.cancelled() and ticket.granted.exception() is None:
                self._release()  # the slot was handed over just as we were cancelled: pass it on
            else:
                self._dequeue(ticket)  # cancelled; one that timed out or was superseded has left already
            raise

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        """Ends the waits that are over, and sets the timer for the next: a scan of at most `max_queue` tickets,
        once per deadline of a request still waiting when the timer was set (most get their slot before)."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now, waiting = loop.time(), [t for clients in self._queues.values() for line in clients.values() for t in line]
        for ticket in waiting:
            if ticket.deadline <= now and not ticket.granted.done():
                self._dequeue(ticket)
                wait_s, bound = ticket.wait
                ticket.granted.set_exception(Overloaded(f"no slot of the backend came free within {wait_s:g} s "
                                                        f"({bound})", retry_after=self.retry_after()))
        if deadlines := [t.deadline for t in waiting if not t.granted.done()]:
            self._arm(loop, min(deadlines))

    def resize(self, limit: int) -> None:
        """A new slot count (a backend down at startup has said its own, a replica set's replica left or came back):
        waiters take the slots it adds; fewer take effect as running requests end."""
        self.limit = max(1, limit)
        while self.running < self.limit and (nxt := self._next()) is not None:
            self.running += 1
            self._grant(nxt)

    def retry_after(self) -> float:
        """Seconds until the queue has probably drained by one request per slot, at least 1."""
        return float(max(1, math.ceil(self._mean_hold_s * (self._queued + 1) / self.limit)))

    def reserve(self, wait_s: float, bound: str) -> Place:
        """A place taken now for a request that asks for its slot later, or Overloaded: a background response queues
        in a task of its own, after its request has answered `queued`. Checked only, each of a burst found the queue
        as it was before any of their tasks had entered it: six were accepted by a queue of one behind one slot, and
        four then failed "queue is full", which no SDK retries. Its request waits for its slot up to `wait_s`, which
        `bound` names."""
        self._room_behind(self._queued)
        self._reserved += 1
        return Place(self, wait_s, bound)

    def give_back(self, place: Place) -> None:
        """The place is no longer held: taken by its request, or its request ended without asking (an answer from
        the cache, or one that rode on an identical request's call)."""
        if place.held:
            place.held = False
            self._reserved -= 1

    def _room_behind(self, queued: int) -> None:
        """Overloaded where a request with `queued` others waiting would find the queue full once the requests
        holding places had come first: they take the free slots, then queue. Whatever the order they come in, the
        queue holds no more than `max_queue`."""
        free = max(0, self.limit - self.running) if queued == 0 else 0
        if self._reserved >= free and queued + self._reserved - free >= self.max_queue:
            raise self._full()

    def _full(self) -> Overloaded:
        return Overloaded(f"backend queue is full ({self.max_queue} waiting)", retry_after=self.retry_after())

    def _check_room(self, key: str) -> None:
        """Overloaded before a newer request replaces an older one, where the newer would find the queue full: the
        older was cancelled and the newer refused, and the user got no completion at all. A queued older one gives
        its place up; a running one frees its slot only once it has stopped."""
        older = self._by_key.get(key)
        self._room_behind(self._queued - (older is not None and not older.granted.done()))

    def _supersede(self, key: str, newer: _Ticket) -> None:
        older = self._by_key.get(key)
        self._by_key[key] = newer
        if older is None:
            return
        older.superseded = True
        if not older.granted.done():
            self._dequeue(older)
            older.granted.set_exception(Superseded("a newer request from the same client replaced this one"))
        elif older.task is not None:
            older.task.cancel()

    def _forget(self, ticket: _Ticket) -> None:
        if ticket.supersede_key is not None and self._by_key.get(ticket.supersede_key) is ticket:
            del self._by_key[ticket.supersede_key]

    def _dequeue(self, ticket: _Ticket) -> None:
        clients = self._queues.get(ticket.priority)
        line = clients.get(ticket.client) if clients else None
        if line is None or ticket not in line:
            return
        line.remove(ticket)
        self._queued -= 1
        if not line:
            del clients[ticket.client]
        if not clients:
            del self._queues[ticket.priority]

    def _release(self) -> None:
        """Hands the freed slot to the next waiter: best priority, then the client served longest ago (unless the
        limit has shrunk below what runs)."""
        nxt = self._next() if self.running <= self.limit else None
        if nxt is None:
            self.running -= 1
        else:
            self._grant(nxt)

    def _grant(self, ticket: _Ticket) -> None:
        self._turns += 1
        self._mark(ticket.client)
        ticket.granted.set_result(None)

    def _mark(self, client: str) -> None:
        self._served[client] = self._turns
        self._served.move_to_end(client)
        if len(self._served) > _CLIENTS_KEPT:
            self._served.popitem(last=False)

    def _next(self) -> _Ticket | None:
        while self._queues:
            ticket = self._pop()
            if not ticket.granted.done():  # a cancelled waiter that has not run its cleanup yet
                return ticket
        return None

    def _pop(self) -> _Ticket:
        """The first ticket of the client served least recently (never: as of when its line was made; forgotten
        while it waits: first), at the best priority; among equals the line made first. Ordering lines by when each
        was made let a client just served, whose line had emptied and that asked again first, go before one served
        long ago. A scan of at most `max_queue` lines (256)."""
        priority = min(self._queues)
        clients = self._queues[priority]
        client = min(clients, key=lambda c: self._served.get(c, 0))
        line = clients[client]
        ticket = line.popleft()
        self._queued -= 1
        if not line:
            del clients[client]
        if not clients:
            del self._queues[priority]
        return ticket
