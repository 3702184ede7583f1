"""The request path below the dialects: route -> backend. One object, built once per app."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import AsyncIterator

from adapters.base import Backend
from adapters.protocol import ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult

from .context import RequestContext
from .router import Router


@dataclass
class Pipeline:
    router: Router

    async def chat(self, req: ChatRequest, ctx: RequestContext) -> AsyncIterator[Chunk]:
        target = await self.router.resolve(req.model)
        async for chunk in self._guarded(target.backend, target.backend.chat(replace(req, model=target.model))):
            yield chunk

    async def complete(self, req: CompletionRequest, ctx: RequestContext) -> AsyncIterator[Chunk]:
        target = await self.router.resolve(req.model)
        async for chunk in self._guarded(target.backend, target.backend.complete(replace(req, model=target.model))):
            yield chunk

    async def embed(self, req: EmbedRequest, ctx: RequestContext) -> EmbedResult:
        target = await self.router.resolve(req.model)
        return await target.backend.embed(replace(req, model=target.model))

    @staticmethod
    async def _guarded(backend: Backend, stream: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        """Closes the backend stream whatever happens above, which cancels the backend's work."""
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
