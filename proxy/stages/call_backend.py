"""The end of the pipeline: the job's request, under the backend's name for the model, to the backend's adapter."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import AsyncIterator, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from adapters.protocol import ChatRequest, Chunk
from adapters.llamacpp_managed import ManagedLlamaCpp
from adapters.replicas import ReplicaSet

from ..job import Job
from .base import Next, Services, Stage


class CallBackend(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        services.registry.register(self)

    def __call__(self, job: Job, next: Next | None = None) -> AsyncIterator[Chunk]:
        assert job.target is not None
        req, backend = job.request, job.target.backend
        if req.model != job.target.model:
            req = replace(req, model=job.target.model)
        return backend.chat(req) if isinstance(req, ChatRequest) else backend.complete(req)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
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
        yield from self._managed()

    def _managed(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Llama-servers Velo runs itself (adapters/llamacpp_managed.py): state, requests waiting for a start or a
        swap, and the time they waited."""
        state = GaugeMetricFamily("velo_managed_state", "1 for the state a managed llama-server is in",
                                  labels=["backend", "model", "state"])
        waiting = GaugeMetricFamily("velo_managed_waiting", "Requests waiting for a managed server to start (or for "
                                    "room to start it)", labels=["backend"])
        users = GaugeMetricFamily("velo_managed_in_flight", "Requests using a managed server", labels=["backend"])
        starts = CounterMetricFamily("velo_managed_starts", "Managed server starts", labels=["backend"])
        swaps = CounterMetricFamily("velo_managed_swaps", "Times a managed server was stopped to make room for "
                                    "another", labels=["backend"])
        wait = CounterMetricFamily("velo_managed_wait_seconds", "Seconds requests waited for a start or a swap",
                                   labels=["backend"])
        for backend in self.services.router.backends.values():
            if isinstance(backend, ManagedLlamaCpp):
                name, stats = [backend.name], backend.stats
                state.add_metric([backend.name, backend.model_name, backend.state], 1)
                waiting.add_metric(name, stats.waiting)
                users.add_metric(name, backend.users)
                starts.add_metric(name, stats.starts)
                swaps.add_metric(name, stats.swaps)
                wait.add_metric(name, stats.wait_s)
        yield from (state, waiting, users, starts, swaps, wait)
