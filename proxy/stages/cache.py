"""Answers from the response cache (proxy/cache/), and whole answers stored into it on their way back."""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from typing import AsyncIterator, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from adapters.bursts import Burst
from adapters.protocol import Chunk, ModelInfo, Usage

from ..cache import CacheLayer
from ..cache.stats import CacheStats
from ..job import Job, Request
from ..keep import fingerprint
from ..tools.calls import with_new_ids
from .base import Next, Services, Stage


class Cache(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        self.layer: CacheLayer | None = None  # opened by open(): the semantic tier loads a model
        services.registry.register(self)

    async def open(self) -> None:
        """The layer of the previous configuration when the cache settings did not change: its entries stay. Its
        counters stay whatever changed (a new layer started them again, and /metrics lost velo_cache_events)."""
        cfg = self.services.config.cache
        if cfg.enabled:
            counters, _ = self.services.lease.hold("cache:counters", CacheStats)
            opening, _ = self.services.lease.hold(f"cache:{fingerprint(cfg)}",
                                                  lambda: asyncio.ensure_future(CacheLayer.create(cfg)), _close)
            self.layer = await opening
            self.layer.counters = counters

    def wraps(self, job: Job) -> bool:
        """Whether the cache is on (a job's outcome says "off" until this stage says otherwise)."""
        return self.layer is not None

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        assert job.target is not None and self.layer is not None
        layer = self.layer
        started = time.perf_counter_ns()
        asked = layer.asked(_keyed(job, await self.services.router.model_info(job.target)), job.caller.tenant,
                            model=job.model, label=job.target.label)
        if job.large:
            await asyncio.to_thread(asked.work_out)
        hit = await layer.lookup(asked, job.cache_bypass)
        if hit is not None:
            job.outcome.cache = hit.kind
            async for chunk in _replay(hit.chunks, started):
                yield chunk
            return
        job.outcome.cache_reason = "" if job.cache_bypass else asked.skip_reason
        job.outcome.cache = "bypass" if job.cache_bypass else "skip" if job.outcome.cache_reason else "miss"
        chunks: list[Chunk] = []
        async with contextlib.aclosing(next(job)) as rest:
            async for chunk in rest:
                if not chunk.empty:  # a backend's empty events are not the answer
                    chunks.append(chunk)
                yield chunk
        if job.outcome.cache == "miss" and not job.outcome.unrepaired:
            await layer.store(asked, chunks)

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


async def _replay(chunks: list[Chunk], started_ns: int) -> AsyncIterator[Chunk]:
    """The cached answer with the replay's own timings (the lookup as prompt evaluation, the replay as decoding,
    no load) and the original token counts, and tool calls with ids of their own, as a fresh answer's (an agent
    pairs results with calls by id); cached chunks are shared, so the ones changed are copied."""
    found, burst = time.perf_counter_ns(), Burst()
    for chunk in chunks:
        chunk = with_new_ids(chunk)
        if chunk.usage is not None:
            now = time.perf_counter_ns()
            chunk = replace(chunk, usage=Usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens,
                                               chunk.usage.cached_tokens, prompt_eval_ns=found - started_ns,
                                               eval_ns=now - found))
        yield chunk
        await burst.pause()  # a long answer replayed whole held the event loop (adapters/bursts.py)


def _keyed(job: Job, info: ModelInfo | None) -> Request:
    """The request as the cache keys it: under the backend and model that answer it, so an answer is never
    replayed for a name that a route, an alias or a config reload has since sent elsewhere, and under the model's
    digest where the backend says one (Ollama's; a model file's on this machine), so a model pulled or rebuilt
    under the same name is not answered for by the one before. NUL between them, which no name holds: "/" (in many
    model names) let two of them read as one (Target.served). A sampled request (`cache_nondeterministic`) is keyed
    by its choice too: the parts of OpenAI's `n` ask the same, and each was answered with the first's sample, n
    copies of one."""
    assert job.target is not None
    digest = info.digest if info is not None else ""
    choice = "" if job.request.options.deterministic else f"\0{job.part}"
    return replace(job.request, model=f"{job.target.served}\0{job.model}\0{digest}{choice}")


async def _close(opening: asyncio.Future) -> None:
    """A layer that never opened (its Redis down at start) has nothing to close: its error was the start's."""
    try:
        layer = await opening
    except Exception:  # noqa: BLE001 - said already, by the start that awaited it
        return
    await layer.close()
