"""The request path below the dialects, one object built once per app:

    route -> cache lookup -> single-flight coalescing -> backend admission queue -> adapter
                      tool-call / structured-output repair on the way back, then the cache store

Every layer sees the internal model only (adapters.protocol), so both dialects and every backend share it.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Callable

from adapters.base import Backend
from adapters.protocol import ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult

from .batching import LATENCY_CRITICAL, AdmissionController, Coalescer, EmbedBatcher
from .batching.config import BatchingConfig
from .cache import CacheLayer
from .cache.keys import exact_key
from .config import ToolsConfig
from .context import RequestContext
from .metrics import Metrics
from .router import Router, Target
from .tools.metrics import ToolMetrics
from .tools.retry import with_retry

log = logging.getLogger("velo.pipeline")

Request = ChatRequest | CompletionRequest
StreamFn = Callable[[Backend, Request], AsyncIterator[Chunk]]


@dataclass
class Pipeline:
    router: Router
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    cache: CacheLayer | None = None  # set once opened (the semantic tier loads a model)
    coalescer: Coalescer = field(default_factory=Coalescer)
    tool_metrics: ToolMetrics = field(default_factory=ToolMetrics)
    metrics: Metrics = field(default_factory=Metrics)
    _admission: dict[str, AdmissionController] = field(default_factory=dict)
    _embedders: dict[str, EmbedBatcher] = field(default_factory=dict)

    async def start(self) -> None:
        """Sizes each backend's admission queue from what it reports (e.g. llama-server slots)."""
        backends = list(self.router.backends.values())
        for backend, limit in zip(backends, await asyncio.gather(*(_slots(b) for b in backends))):
            self._admission[backend.name] = AdmissionController(limit=limit, max_queue=self.batching.max_queue)
            self._embedders[backend.name] = EmbedBatcher(backend.embed, self.batching.embed_window_ms,
                                                         self.batching.embed_max_inputs)

    async def close(self) -> None:
        for batcher in self._embedders.values():
            await batcher.close()
        if self.cache is not None:
            await self.cache.close()

    def admission(self, backend: str) -> AdmissionController:
        return self._admission[backend]

    def admission_controllers(self) -> dict[str, AdmissionController]:
        return dict(self._admission)

    def embed_batchers(self) -> dict[str, EmbedBatcher]:
        return dict(self._embedders)

    def chat(self, req: ChatRequest, ctx: RequestContext) -> AsyncIterator[Chunk]:
        """The stream itself, not a wrapper around it, so that closing it closes the backend call at once."""
        return self._generate(req, ctx, lambda b, r: b.chat(r))  # type: ignore[arg-type]

    def complete(self, req: CompletionRequest, ctx: RequestContext) -> AsyncIterator[Chunk]:
        return self._generate(req, ctx, lambda b, r: b.complete(r))  # type: ignore[arg-type]

    async def embed(self, req: EmbedRequest, ctx: RequestContext) -> EmbedResult:
        target = await self.router.resolve(req.model)
        batcher = self._embedders.get(target.backend.name)
        with self.metrics.observe(ctx.route, req.model, target.backend.name):
            req = replace(req, model=target.model)
            return await (batcher.embed(req) if batcher else target.backend.embed(req))

    async def _generate(self, req: Request, ctx: RequestContext, call: StreamFn) -> AsyncIterator[Chunk]:
        target = await self.router.resolve(req.model)
        answer = self._answer(req, ctx, target, call)
        with self.metrics.observe(ctx.route, req.model, target.backend.name) as seen:
            async with contextlib.aclosing(answer):  # closing cancels the backend work below
                async for chunk in answer:
                    seen.chunk(chunk)
                    yield chunk

    async def _answer(self, req: Request, ctx: RequestContext, target: Target, call: StreamFn
                      ) -> AsyncIterator[Chunk]:
        hit = await self._lookup(req, ctx)
        if hit is not None:
            for chunk in hit:
                yield chunk
            return
        run = lambda r: self._shared(r, ctx, target, call)  # noqa: E731 - a retry re-runs the backend call
        stream = with_retry(run, req, self.tools.max_retries, self.tool_metrics, ctx.repairs) \
            if self.tools.repair else run(req)
        chunks: list[Chunk] = []
        async with contextlib.aclosing(stream):  # closing cancels the backend work below
            async for chunk in stream:
                chunks.append(chunk)
                yield chunk
        if self.cache is not None and ctx.cache_status == "miss":
            await self.cache.store(req, ctx.tenant, chunks, route=req.model)

    async def _lookup(self, req: Request, ctx: RequestContext) -> list[Chunk] | None:
        if self.cache is None:
            ctx.cache_status = "off"
            return None
        hit = await self.cache.lookup(req, ctx.tenant, ctx.cache_bypass, route=req.model)
        ctx.cache_status = hit.kind if hit else ("bypass" if ctx.cache_bypass else "miss")
        return hit.chunks if hit else None

    def _shared(self, req: Request, ctx: RequestContext, target: Target, call: StreamFn) -> AsyncIterator[Chunk]:
        """Deterministic requests identical to one in flight (same tenant) ride on its backend call. Autocomplete
        that a newer request may replace does not: replacing the leader would fail every follower with it."""
        factory = lambda: self._admitted(req, ctx, target, call)  # noqa: E731
        if self.batching.coalesce and req.options.deterministic and self._supersede_key(ctx) is None:
            return self.coalescer.stream(exact_key(req, ctx.tenant), factory)
        return factory()

    def _supersede_key(self, ctx: RequestContext) -> str | None:
        if ctx.priority == LATENCY_CRITICAL and self.batching.supersede_autocomplete:
            return f"{ctx.tenant}:{ctx.client}:autocomplete"
        return None

    async def _admitted(self, req: Request, ctx: RequestContext, target: Target, call: StreamFn
                        ) -> AsyncIterator[Chunk]:
        """Holds one of the backend's slots for the whole stream; autocomplete jumps the queue and a newer one
        from the same client replaces the older."""
        supersede = self._supersede_key(ctx)
        admission = self._admission.get(target.backend.name)
        slot = admission.slot(ctx.priority, ctx.client, supersede) if admission else contextlib.nullcontext()
        async with slot:
            stream = call(target.backend, replace(req, model=target.model))
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for chunk in stream:
                    yield chunk


async def _slots(backend: Backend) -> int:
    """What the backend reports; one that cannot say at startup (down) gets its configured limit or 4."""
    try:
        return max(1, await backend.concurrency())
    except Exception as e:  # noqa: BLE001 - a backend that is down must not stop Velo from starting
        log.warning("backend %r did not report its concurrency (%s); using %d", backend.name, e,
                    backend.config.max_concurrency or 4)
        return backend.config.max_concurrency or 4
