"""Answers from the response cache (proxy/cache/), and whole answers stored into it on their way back."""
from __future__ import annotations

import contextlib
from typing import AsyncIterator, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from adapters.protocol import Chunk

from ..cache import CacheLayer
from ..job import Job
from .base import Next, Services, Stage


class Cache(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        self.layer: CacheLayer | None = None  # opened by start(): the semantic tier loads a model
        services.registry.register(self)

    async def start(self) -> None:
        if self.services.config.cache.enabled:
            self.layer = await CacheLayer.create(self.services.config.cache)

    async def close(self) -> None:
        if self.layer is not None:
            await self.layer.close()

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        if self.layer is None:
            job.outcome.cache = "off"
        else:
            hit = await self.layer.lookup(job.request, job.caller.tenant, job.cache_bypass, route=job.model)
            job.outcome.cache = hit.kind if hit else ("bypass" if job.cache_bypass else "miss")
            if hit is not None:
                for chunk in hit.chunks:
                    yield chunk
                return
        chunks: list[Chunk] = []
        async with contextlib.aclosing(next(job)) as rest:
            async for chunk in rest:
                chunks.append(chunk)
                yield chunk
        if self.layer is not None and job.outcome.cache == "miss":
            await self.layer.store(job.request, job.caller.tenant, chunks, route=job.model)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self.layer.stats() if self.layer is not None else {}
        events = CounterMetricFamily("velo_cache_events", "Cache outcomes by tier and model",
                                     labels=["tier", "model", "outcome"])
        size = GaugeMetricFamily("velo_cache_size", "Cache size (bytes, entries)", labels=["what"])
        for tier, models in stats.get("events", {}).items():
            for model, outcomes in models.items():
                for outcome, n in outcomes.items():
                    events.add_metric([tier, model, outcome], n)
        for what, n in stats.get("bytes", {}).items():
            size.add_metric([what], n)
        yield events
        yield size
