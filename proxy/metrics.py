"""Prometheus metrics, per app in its own `CollectorRegistry` (never the global one, so two apps in one process, as
in tests, never share counters).

Per-request series (counts, latency, time to first token, tokens/s) are observed by the pipeline's observe stage as
requests run. Live state (queues, coalescing, embedding batches, cache, repairs, replicas) is exported by the
stage that owns it, each registered as its own collector, so it is read at scrape time and never drifts.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from adapters.errors import VeloError
from adapters.protocol import Chunk

from .recent import Finished, Recent

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


@dataclass
class Observation:
    """One request as it streams: when its first token came and how many tokens it produced."""

    started: float = field(default_factory=time.perf_counter)
    first: float | None = None
    tokens: int = 0
    chunks: int = 0
    cache: str = ""  # the cache outcome, for the dashboard's list of recent requests
    prompt: str = ""  # the last user turn, kept only with `[server] log_prompts`
    tenant: str = ""  # the key's scope the request belongs to
    status: str = ""  # the HTTP status it ended with (499: the client left), once it has ended

    def chunk(self, chunk: Chunk) -> None:
        self.chunks += 1
        if self.first is None:
            self.first = time.perf_counter()
        if chunk.usage is not None and chunk.usage.completion_tokens:
            self.tokens = chunk.usage.completion_tokens  # the backend's count beats ours
        elif chunk.text:
            self.tokens += 1


class RequestMetrics:
    """Per-request series: counts by outcome, latency, time to first token, tokens and their rate. A collector of
    its own (registered in each configuration's registry), so the series outlive config reloads."""

    def __init__(self) -> None:
        labels = ("endpoint", "model", "backend")  # model: a listed or configured name, else "other" (router.py)
        self.requests = Counter("velo_requests", "Requests by outcome (HTTP status; 499: client left or cancelled)",
                                (*labels, "status"), registry=None)
        self.latency = Histogram("velo_request_seconds", "Whole-request latency", labels,
                                 buckets=_LATENCY_BUCKETS, registry=None)
        self.ttft = Histogram("velo_time_to_first_token_seconds", "Time to the first streamed chunk", labels,
                              buckets=_LATENCY_BUCKETS, registry=None)
        self.tokens = Counter("velo_completion_tokens", "Tokens generated", ("model", "backend"), registry=None)
        self.token_rate = Histogram("velo_tokens_per_second", "Decode speed per request, after the first token",
                                    ("model", "backend"), buckets=_RATE_BUCKETS, registry=None)
        self.recent = Recent()
        # Each label set's children, looked up once: `labels()` takes a lock and builds a key each call (4 of them
        # were ~5 us of a request's ~550 at max req/s). Bounded as the label values are (model: router.py).
        self._children: dict[tuple[str, str, str], tuple[Histogram, Histogram, Counter, Histogram]] = {}
        self._counts: dict[tuple[str, ...], Counter] = {}  # (endpoint, model, backend, status) -> velo_requests

    def collect(self) -> Iterator[Metric]:
        for series in (self.requests, self.latency, self.ttft, self.tokens, self.token_rate):
            yield from series.collect()

    @contextmanager
    def observe(self, endpoint: str, model: str, backend: str) -> Iterator[Observation]:
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
            obs.status = status
            self._record(obs, status, endpoint, model, backend)

    def count(self, endpoint: str, status: str) -> None:
        """A request that reached no model (refused at the edge, a listing): counted, not timed."""
        self.requests.labels(endpoint, "", "", status).inc()

    def _record(self, obs: Observation, status: str, endpoint: str, model: str, backend: str) -> None:
        now = time.perf_counter()
        ttft = None if obs.first is None else obs.first - obs.started
        decoded = obs.first is not None and obs.chunks > 1 and obs.tokens > 1 and now > obs.first \
            and obs.cache not in ("exact", "semantic")  # one whole chunk, or a replay, tells no decode speed
        rate = (obs.tokens - 1) / (now - obs.first) if decoded else None
        self.recent.add(Finished(time.time(), endpoint, model, backend, status, round(now - obs.started, 4),
                                 None if ttft is None else round(ttft, 4), obs.tokens,
                                 None if rate is None else round(rate, 1), obs.cache, obs.prompt, obs.tenant))
        self._counted(endpoint, model, backend, status).inc()
        latency, first_token, tokens, token_rate = self._series(endpoint, model, backend)
        latency.observe(now - obs.started)
        if ttft is None:
            return
        first_token.observe(ttft)
        tokens.inc(obs.tokens)
        if rate is not None:
            token_rate.observe(rate)

    def _counted(self, *labels: str) -> Counter:
        """The requests counter's child for `labels`, looked up once as `_series` looks up the others (0.4% of a short
        chat request's instructions in Velo: 2,319 -> 2,310 thousand, callgrind)."""
        if (found := self._counts.get(labels)) is None:
            found = self._counts[labels] = self.requests.labels(*labels)
        return found

    def _series(self, endpoint: str, model: str, backend: str) -> tuple[Histogram, Histogram, Counter, Histogram]:
        key = (endpoint, model, backend)
        if (found := self._children.get(key)) is None:
            found = self._children[key] = (self.latency.labels(*key), self.ttft.labels(*key),
                                           self.tokens.labels(model, backend), self.token_rate.labels(model, backend))
        return found
