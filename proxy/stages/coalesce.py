"""Single-flight (proxy/batching/coalesce.py): a deterministic job identical to one in flight (same tenant, same
backend model, streamed or not alike, background or not alike, the same `keep_alive` and performance options) rides
on its backend call.
Autocomplete that a newer request may replace does not: replacing the leader would fail every follower with it. A
one-answer leader's backend stream is folded into one chunk below (adapters' one_answer), so a streamed request
that joined it got its whole answer at the end. A request that joined gets tool-call ids of its own, as a cache hit
does."""
from __future__ import annotations

import asyncio
import contextlib
import functools
from dataclasses import replace
from typing import AsyncIterator, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from adapters.protocol import Chunk

from ..batching import Coalescer
from ..cache.keys import backend_only, digest, exact_key
from ..job import Job
from ..keep import Tally
from ..tools.calls import with_new_ids
from .admit import supersede_key
from .base import Next, Services, Stage


class Coalesce(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        self.coalescer = Coalescer(services.lease.hold("metrics:coalesced", Tally)[0])
        services.registry.register(self)

    def wraps(self, job: Job) -> bool:
        """Whether the job may share an identical one's call: coalescing on, an answer that does not vary, and no
        newer autocomplete to replace it."""
        config = self.services.config
        return config.batching.coalesce and job.request.options.deterministic and supersede_key(job, config) is None

    def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        if job.large:
            return self._keyed_apart(job, next)
        return self._stream(_key(job), job, next)

    async def _keyed_apart(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        """A large job's stream, its key worked out on a thread (it reads the whole request)."""
        key = await asyncio.to_thread(_key, job)
        async with contextlib.aclosing(self._stream(key, job, next)) as chunks:
            async for chunk in chunks:
                yield chunk

    def _stream(self, key: str, job: Job, next: Next) -> AsyncIterator[Chunk]:
        return self.coalescer.stream(key, lambda: next(job), functools.partial(_joined, job), with_new_ids,
                                     functools.partial(_billed, job))

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield CounterMetricFamily("velo_coalesced", "Requests that joined an identical in-flight request",
                                  value=self.coalescer.coalesced)
        yield GaugeMetricFamily("velo_coalesce_flights", "Shared backend streams in flight",
                                value=self.coalescer.in_flight)


def _key(job: Job) -> str:
    """The settled request under the backend and model that answer it, not the name asked: a listing refresh that
    moved a model to another backend mid-flight had the next request for it ride on the first backend's call. Two
    names of one backend model (aliases, a preset whose settings the request already holds) share a call: nothing
    below this stage reads the name. What goes with the leader's call only must be the same too: a follower's would
    be lost. So must how long the call may wait for a slot: a background response (a place taken at the edge,
    Job.place) that rode on an interactive stream's call failed with it after `queue_timeout_s`, where alone it
    waits up to its backend's `total_timeout`."""
    assert job.target is not None
    req = job.request
    asked = replace(req, model=job.target.served)
    return f"{exact_key(asked, job.caller.tenant)}:{req.stream}:{job.place is not None}:{digest(backend_only(req))}"


def _joined(job: Job) -> None:
    """The job needs no slot of its own: the place in the queue it took at the edge (a background response's) is
    given back now, not when it ends. Held, it counted as waiting: a queue of 2 with one call waiting, and a response
    riding on it, refused a third request as full."""
    job.outcome.coalesced = True
    job.give_back()


def _billed(job: Job, paid: list[Chunk] | None, upto: list[Chunk] | None) -> None:
    """What of the shared call the job pays for (the limit stage charges it): the rest, where the request that
    started the call left before its end, having got `paid`; or all of it, where that request left and the one that
    got the whole answer had gone. Else a key sent a greedy request twice, dropped the first, and got the whole
    answer for what the first had got."""
    job.outcome.billed = (paid, upto)
