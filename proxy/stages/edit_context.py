"""Context editing the client asked for (Anthropic's `context_management`, proxy/context_edits.py): the oldest
tool results and thinking cleared once the conversation passes its trigger, before the fit stage measures the
window and before the cache keys the request. What each edit did goes to `job.outcome.context_edits`, which the
Anthropic dialect reports as `context_management.applied_edits`."""
from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace

from adapters.protocol import ChatRequest

from .. import context_edits
from ..job import Job
from ..token_count import counter
from .base import Prepare


class EditContext(Prepare):
    async def prepare(self, job: Job, held: AsyncExitStack) -> Job:
        req = job.request
        if not job.context_edits or not isinstance(req, ChatRequest):
            return job
        assert job.target is not None
        info = await self.services.router.model_info(job.target)
        edited = await context_edits.apply(req, job.context_edits, counter(job.target, info))
        job.outcome.context_edits = edited.applied
        return replace(job, request=edited.request) if edited.applied else job
