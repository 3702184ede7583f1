"""What a pipeline stage is. A stage wraps the rest of the pipeline, as an aiohttp middleware wraps a handler:

    class RateLimit(Stage):
        async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
            ...                      # before: may raise (a 4xx), or answer without calling next
            async with contextlib.aclosing(next(job)) as rest:
                async for chunk in rest:
                    yield chunk      # during: may look at or change each chunk
            ...                      # after

plus one line in proxy/pipeline.py's STAGES. A stage with nothing to do for a job returns `next(job)` itself from a
plain `__call__`, and keeps its generator for the jobs it acts on (limit, cache, repair, offer tools, coalesce):
every generator layer costs each request and each chunk a hop. A stage is built anew for each configuration (a
reload makes a new pipeline); what must outlive that goes through `services.lease`. A stage writes only
`job.outcome` (and `job.target`, for resolve); one that needs live state exported on /metrics registers itself as a
Prometheus collector (`collect`).
Leaving the `async with` early closes the rest of the pipeline, which cancels the backend's work.
"""
from __future__ import annotations

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

    def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        raise NotImplementedError
