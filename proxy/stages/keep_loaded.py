"""Each request holds its model loaded while it runs and sets how long it stays after (proxy/residency.py)."""
from __future__ import annotations

import contextlib
from typing import AsyncIterator

from adapters.protocol import Chunk

from ..job import Job
from ..residency import Residency
from .base import Next, Services, Stage


class KeepLoaded(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        self.residency = Residency()

    async def start(self) -> None:
        await self.residency.start()

    async def close(self) -> None:
        await self.residency.close()

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        assert job.target is not None
        with self.residency.use(job.target, job.request.keep_alive):
            async with contextlib.aclosing(next(job)) as rest:
                async for chunk in rest:
                    yield chunk
