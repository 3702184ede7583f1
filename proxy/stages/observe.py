"""Counts, times and measures every request on its way through (proxy/metrics.py holds the Prometheus series)."""
from __future__ import annotations

import contextlib
from typing import AsyncIterator

from adapters.protocol import Chunk

from ..job import Job
from ..metrics import RequestMetrics
from .base import Next, Services, Stage


class Observe(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        self.metrics, _ = services.lease.hold("metrics:requests", RequestMetrics)
        services.registry.register(self.metrics)

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        assert job.target is not None
        with self.metrics.observe(job.caller.path, job.model, job.target.backend.name) as seen:
            async with contextlib.aclosing(next(job)) as rest:
                async for chunk in rest:
                    seen.chunk(chunk)
                    yield chunk
