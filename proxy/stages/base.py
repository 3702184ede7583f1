"""What a pipeline stage is. Two kinds. A stage that only prepares the job (looks a name up, checks, trims, waits
for a slot) subclasses `Prepare`:

    class RateLimit(Prepare):
        async def prepare(self, job: Job, held: AsyncExitStack) -> Job:
            ...                      # may raise (a 4xx); returns the job the rest sees
            held.enter_context(...)  # what it holds until the answer ends (a slot), closed then, even on error

A stage that acts on the stream itself (looks at or changes each chunk, answers without calling the rest, calls it
again) wraps the rest, as an aiohttp middleware wraps a handler:

    class Count(Stage):
        def wraps(self, job: Job) -> bool:
            return ...               # whether this job needs the stage at all (default: every job)

        async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
            ...                      # before: may raise, or answer without calling next
            async with contextlib.aclosing(next(job)) as rest:
                async for chunk in rest:
                    yield chunk      # during: may look at or change each chunk
            ...                      # after

plus one line in proxy/pipeline.py's STAGES. Every generator layer costs each chunk a hop (~780 instructions, of a
256-piece stream's ~25,000 thousand), so the pipeline runs a run of preparing stages, and the wrapping stages a job
does not need, in one generator (Pipeline._prepared). A stage is built anew for each configuration (a reload makes
a new pipeline); what must outlive that goes through `services.lease`. A stage writes only `job.outcome` (and
`job.target`, for resolve); one that needs live state exported on /metrics registers itself as a Prometheus
collector (`collect`).
Leaving the `async with` early closes the rest of the pipeline, which cancels the backend's work.
"""
from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from prometheus_client import CollectorRegistry

from adapters.protocol import Chunk

from ..config import Config
from ..inflight import InFlight
from ..job import Job
from ..keep import Lease
from ..router import Router

Next = Callable[[Job], AsyncIterator[Chunk]]


@dataclass
class Services:
    """What stages are built from, once per configuration generation (proxy/generation.py). State that should
    outlive a config reload when its settings did not change (queues, an open cache, counters) is held through
    `lease` (proxy/keep.py) under a key naming those settings."""

    config: Config
    router: Router
    registry: CollectorRegistry
    lease: Lease
    inflight: InFlight  # one per app, kept through config reloads


class Stage:
    def __init__(self, services: Services) -> None:
        self.services = services

    async def open(self) -> None:
        """Called once the backends are open, for what may fail (the cache's tiers): it refuses a reload, so it must
        leave what this configuration shares with the one in force as it is."""

    async def start(self) -> None:
        """Called once every stage opened (a stage may ask the backends things); what can no longer fail, such as
        applying new settings to what the configuration in force shares (a key's limits, a backend's queue)."""

    async def close(self) -> None:
        """Called before the backends close."""

    def wraps(self, job: Job) -> bool:
        """Whether `job` needs this stage: one it does not need passes it by without a generator layer."""
        return True

    def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        raise NotImplementedError


class Prepare(Stage):
    """A stage with nothing to do once the answer starts: the pipeline awaits `prepare` in order, in one generator
    with the other preparing stages around it, and closes `held` when the rest's stream ends."""

    async def prepare(self, job: Job, held: AsyncExitStack) -> Job:
        raise NotImplementedError
