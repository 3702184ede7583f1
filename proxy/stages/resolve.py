"""Which backend serves the job's model (proxy/router.py), before anything that needs to know it."""
from __future__ import annotations

import contextlib
from typing import AsyncIterator

from adapters.protocol import Chunk

from ..job import Job
from .base import Next, Stage


class Resolve(Stage):
    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        job.target = await self.services.router.resolve(job.model)
        async with contextlib.aclosing(next(job)) as rest:
            async for chunk in rest:
                yield chunk
