"""Single-flight (proxy/batching/coalesce.py): a deterministic job identical to one in flight (same tenant, streamed
or not alike, the same `keep_alive`) rides on its backend call. Autocomplete that a newer request may replace does
not: replacing the leader would fail every follower with it. A one-answer leader's backend stream is folded into one
chunk below (adapters' one_answer), so a streamed request that joined it got its whole answer at the end."""
from __future__ import annotations

from typing import AsyncIterator, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from adapters.protocol import Chunk

from ..batching import Coalescer
from ..cache.keys import exact_key
from ..job import Job
from .admit import supersede_key
from .base import Next, Services, Stage


class Coalesce(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        self.coalescer = Coalescer()
        services.registry.register(self)

    def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        config = self.services.config
        if config.batching.coalesce and job.request.options.deterministic and supersede_key(job, config) is None:
            # `keep_alive` is no part of the answer (the cache's key leaves it out), but it goes to the backend with
            # the leader's call: a follower's own would be lost
            key = f"{exact_key(job.request, job.caller.tenant)}:{job.request.stream}:{job.request.keep_alive!r}"
            return self.coalescer.stream(key, lambda: next(job))
        return next(job)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield CounterMetricFamily("velo_coalesced", "Requests that joined an identical in-flight request",
                                  value=self.coalescer.coalesced)
        yield GaugeMetricFamily("velo_coalesce_flights", "Shared backend streams in flight",
                                value=self.coalescer.in_flight)
