"""The end of the pipeline: the job's request, under the backend's name for the model, to the backend's adapter."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import AsyncIterator, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from adapters.protocol import ChatRequest, Chunk
from adapters.llamacpp_managed import ManagedLlamaCpp
from adapters.replicas import ReplicaSet

from ..best_of import ranked_or_not
from ..job import Job
from .base import Next, Services, Stage


# The figures a backend gives of itself (Backend.figures: Velo's engine, engine/engine.py metrics()), as /metrics
# names them: (metric, gauge or counter, help, the backend's name for it).
FIGURES = (
    ("velo_engine_running", "gauge", "Sequences the engine is decoding", "running"),
    ("velo_engine_waiting", "gauge", "Sequences waiting for room in the engine's batch or KV cache", "waiting"),
    ("velo_engine_kv_blocks", "gauge", "Blocks of the engine's KV cache", "kv_blocks_total"),
    ("velo_engine_kv_blocks_free", "gauge", "Blocks of the engine's KV cache that no sequence nor cached prefix holds",
     "kv_blocks_free"),
    ("velo_engine_kv_usage", "gauge", "Share of the engine's KV cache in use, 0 to 1", "kv_usage"),
    ("velo_engine_steps", "counter", "Steps (batched forward passes) the engine ran", "steps"),
    ("velo_engine_prompt_tokens", "counter", "Prompt tokens the engine took", "prompt_tokens"),
    ("velo_engine_cached_prompt_tokens", "counter", "Prompt tokens the engine's prefix cache served",
     "cached_prompt_tokens"),
    ("velo_engine_generated_tokens", "counter", "Tokens the engine generated", "generated_tokens"),
    ("velo_engine_preemptions", "counter", "Sequences the engine set back for KV room (recomputed later)",
     "preemptions"),
    ("velo_engine_draft_proposed", "counter", "Draft tokens speculative decoding proposed", "spec_proposed"),
    ("velo_engine_draft_accepted", "counter", "Draft tokens the target model accepted", "spec_accepted"))


class CallBackend(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        services.registry.register(self)

    def __call__(self, job: Job, next: Next | None = None) -> AsyncIterator[Chunk]:
        assert job.target is not None
        req, backend = job.request, job.target.backend
        if req.model != job.target.model:
            req = replace(req, model=job.target.model)
        if isinstance(req, ChatRequest):
            return backend.chat(req)
        return ranked_or_not(backend.complete, req) if job.own_logprobs else backend.complete(req)

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
        yield from self._figures()

    def _figures(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """What each backend says of itself (FIGURES), where it says it."""
        families = [(GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, doc, labels=["backend"])
                    for name, kind, doc, _ in FIGURES]
        for backend in self.services.router.backends.values():
            figures = backend.figures()
            for family, (*_, key) in zip(families, FIGURES):
                if key in figures:
                    family.add_metric([backend.name], figures[key])
        yield from families

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
