"""Context editing the client asked for (Anthropic's `context_management`, proxy/context_edits.py): the oldest
tool results and thinking cleared once the conversation passes its trigger, before the fit stage measures the
window and before the cache keys the request. What each edit did goes to `job.outcome.context_edits`, which the
Anthropic dialect reports as `context_management.applied_edits`."""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import AsyncIterator

from adapters.protocol import ChatRequest, Chunk

from .. import context_edits
from ..job import Job
from ..token_count import counter
from .base import Next, Stage


class EditContext(Stage):
    def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        """No edits asked for: the rest of the pipeline's stream as is (see stages/base.py)."""
        if not job.context_edits or not isinstance(job.request, ChatRequest):
            return next(job)
        return self._edited(job, job.request, next)

    async def _edited(self, job: Job, req: ChatRequest, next: Next) -> AsyncIterator[Chunk]:
        assert job.target is not None
        info = await self.services.router.model_info(job.target)
        edited = await context_edits.apply(req, job.context_edits, counter(job.target, info))
        job.outcome.context_edits = edited.applied
        async with contextlib.aclosing(next(replace(job, request=edited.request) if edited.applied else job)) as rest:
            async for chunk in rest:
                yield chunk
