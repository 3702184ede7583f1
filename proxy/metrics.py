"""Prometheus metrics for one app: its own `CollectorRegistry` (never the global one, so two apps in one process,
as in tests, never share counters).

Per-request figures (counts, latency, time to first token, tokens/s) are observed by the pipeline as requests
run; live state (queue depth, in-flight, coalescing, embed batches, cache and tool-repair counters) is read from
the pipeline at scrape time, so it never drifts from the truth.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from adapters.base import Backend
from adapters.errors import VeloError
from adapters.protocol import Chunk
from adapters.replicas import ReplicaSet

if TYPE_CHECKING:
    from .pipeline import Pipeline

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


@dataclass
class Observation:
    """One request as it streams: when its first token came and how many tokens it produced."""

    started: float = field(default_factory=time.perf_counter)
    first: float | None = None
    tokens: int = 0

    def chunk(self, chunk: Chunk) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        if chunk.usage is not None and chunk.usage.completion_tokens:
            self.tokens = chunk.usage.completion_tokens  # the backend's count beats ours
        elif chunk.text:
            self.tokens += 1


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("route", "model", "backend")
        self.requests = Counter("velo_requests", "Requests by outcome (HTTP status; 499: client left)",
                                (*labels, "status"), registry=self.registry)
        self.latency = Histogram("velo_request_seconds", "Whole-request latency", labels,
                                 buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.ttft = Histogram("velo_time_to_first_token_seconds", "Time to the first streamed chunk", labels,
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tokens = Counter("velo_completion_tokens", "Tokens generated", ("model", "backend"),
                              registry=self.registry)
        self.token_rate = Histogram("velo_tokens_per_second", "Decode speed per request, after the first token",
                                    ("model", "backend"), buckets=_RATE_BUCKETS, registry=self.registry)

    def watch(self, pipeline: "Pipeline") -> None:
        """Exports the pipeline's live state on every scrape."""
        self.registry.register(_PipelineCollector(pipeline))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    @contextmanager
    def observe(self, route: str, model: str, backend: str) -> Iterator[Observation]:
        """Counts and times the request run inside the block; the exception leaving it decides the status."""
        obs = Observation()
        status = "200"
        try:
            yield obs
        except VeloError as e:
            status = str(e.status)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            status = "499"
            raise
        except Exception:
            status = "500"
            raise
        finally:
            self._record(obs, status, route, model, backend)

    def _record(self, obs: Observation, status: str, route: str, model: str, backend: str) -> None:
        now = time.perf_counter()
        self.requests.labels(route, model, backend, status).inc()
        self.latency.labels(route, model, backend).observe(now - obs.started)
        if obs.first is None:
            return
        self.ttft.labels(route, model, backend).observe(obs.first - obs.started)
        self.tokens.labels(model, backend).inc(obs.tokens)
        if obs.tokens > 1 and now > obs.first:
            self.token_rate.labels(model, backend).observe((obs.tokens - 1) / (now - obs.first))


class _PipelineCollector(Collector):
    def __init__(self, pipeline: "Pipeline"):
        self.pipeline = pipeline

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        p = self.pipeline
        queued = GaugeMetricFamily("velo_queue_depth", "Requests waiting for a backend slot", labels=["backend"])
        running = GaugeMetricFamily("velo_in_flight", "Requests holding a backend slot", labels=["backend"])
        limit = GaugeMetricFamily("velo_backend_slots", "Backend concurrency limit", labels=["backend"])
        for name, ctl in p.admission_controllers().items():
            queued.add_metric([name], ctl.queued)
            running.add_metric([name], ctl.running)
            limit.add_metric([name], ctl.limit)
        yield from (queued, running, limit)
        yield CounterMetricFamily("velo_coalesced", "Requests that joined an identical in-flight request",
                                  value=p.coalescer.coalesced)
        yield GaugeMetricFamily("velo_coalesce_flights", "Shared backend streams in flight",
                                value=p.coalescer.in_flight)
        batches = CounterMetricFamily("velo_embed_backend_calls", "Embedding calls sent after batching",
                                      labels=["backend"])
        for name, batcher in p.embed_batchers().items():
            batches.add_metric([name], batcher.batches)
        yield batches
        yield from _replica_families(p.router.backends.values())
        yield from _cache_families(p.cache.stats() if p.cache is not None else None)
        yield _tool_family(p.tool_metrics.snapshot())


def _replica_families(backends: Iterable[Backend]) -> Iterator[GaugeMetricFamily]:
    """Per replica of each replica set: requests outstanding, and whether it takes requests at all."""
    outstanding = GaugeMetricFamily("velo_replica_outstanding", "Requests in flight on a replica",
                                    labels=["backend", "replica"])
    up = GaugeMetricFamily("velo_replica_up", "1 when a replica passes health probes and its circuit is closed",
                           labels=["backend", "replica"])
    now = time.monotonic()
    for backend in backends:
        for replica in backend.replicas if isinstance(backend, ReplicaSet) else []:
            labels = [backend.name, replica.backend.name]
            outstanding.add_metric(labels, replica.outstanding)
            up.add_metric(labels, float(replica.healthy and replica.closed(now)))
    yield outstanding
    yield up


def _cache_families(stats: dict | None) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    events = CounterMetricFamily("velo_cache_events", "Cache outcomes by tier and route",
                                 labels=["tier", "route", "outcome"])
    size = GaugeMetricFamily("velo_cache_size", "Cache size (bytes, entries)", labels=["what"])
    for tier, routes in (stats or {}).get("events", {}).items():
        for route, outcomes in routes.items():
            for outcome, n in outcomes.items():
                events.add_metric([tier, route, outcome], n)
    for what, n in (stats or {}).get("bytes", {}).items():
        size.add_metric([what], n)
    yield events
    yield size


def _tool_family(snapshot: dict[str, dict[str, int]]) -> CounterMetricFamily:
    repairs = CounterMetricFamily("velo_tool_repairs", "Tool-call and structured-output repairs",
                                  labels=["model", "kind"])
    for model, counts in snapshot.items():
        for kind, n in counts.items():
            repairs.add_metric([model, kind], n)
    return repairs
