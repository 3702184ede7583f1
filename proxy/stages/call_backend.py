"""The end of the pipeline: the job's request, under the backend's name for the model, to the backend's adapter."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import AsyncIterator, Iterator

from prometheus_client.core import GaugeMetricFamily

from adapters.protocol import ChatRequest, Chunk
from adapters.replicas import ReplicaSet

from ..job import Job
from .base import Next, Services, Stage


class CallBackend(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        services.registry.register(self)

    def __call__(self, job: Job, next: Next | None = None) -> AsyncIterator[Chunk]:
        assert job.target is not None
        req, backend = replace(job.request, model=job.target.model), job.target.backend
        return backend.chat(req) if isinstance(req, ChatRequest) else backend.complete(req)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Per replica of each replica set: requests outstanding, and whether it takes requests at all."""
        outstanding = GaugeMetricFamily("velo_replica_outstanding", "Requests in flight on a replica",
                                        labels=["backend", "replica"])
        up = GaugeMetricFamily("velo_replica_up", "1 when a replica passes health probes and its circuit is closed",
                               labels=["backend", "replica"])
        now = time.monotonic()
        for backend in self.services.router.backends.values():
            for replica in backend.replicas if isinstance(backend, ReplicaSet) else []:
                labels = [backend.name, replica.backend.name]
                outstanding.add_metric(labels, replica.outstanding)
                up.add_metric(labels, float(replica.healthy and replica.closed(now)))
        yield outstanding
        yield up
