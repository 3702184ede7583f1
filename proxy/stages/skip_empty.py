"""A stream's chunks with nothing to send stop here: a backend's role-only delta, llama-server's progress through a
prompt. The stream's first byte is then its first content, so an error before it keeps its HTTP status; while
nothing comes, the route's heartbeat timer keeps the client (proxy/http_io.py, `server.heartbeat_s`).
"""
from __future__ import annotations

import contextlib
from typing import AsyncIterator

from adapters.protocol import Chunk

from ..job import Job
from .base import Next, Stage


class SkipEmpty(Stage):
    def wraps(self, job: Job) -> bool:
        """A one-answer request is folded whole, empty chunks and all."""
        return job.request.stream

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        async with contextlib.aclosing(next(job)) as rest:
            async for chunk in rest:
                if not chunk.empty:
                    yield chunk
