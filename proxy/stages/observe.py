"""Counts, times, measures and logs every request on its way through (proxy/metrics.py holds the Prometheus series,
proxy/request_log.py the log lines), and shows it in the list of requests in flight (proxy/inflight.py).

A stream's chunks with nothing to send stop here, where each chunk is looked at already: a backend's role-only
delta, llama-server's progress through a prompt. The stream's first byte is then its first content, so an error
before it keeps its HTTP status; while nothing comes, the route's heartbeat timer keeps the client
(proxy/http_io.py, `server.heartbeat_s`). A stage of their own cost every piece a generator layer: 2.2% of a
256-piece stream's instructions (23,852 -> 23,332 thousand).
"""
from __future__ import annotations

import contextlib
from typing import AsyncIterator

from adapters.protocol import Chunk, CompletionRequest

from ..job import Job, Request
from ..metrics import RequestMetrics
from ..request_log import RequestLine
from .base import Next, Services, Stage

_PROMPT_CHARS = 300  # of the last user turn, shown on the dashboard with log_prompts
_IDS_SHOWN = _PROMPT_CHARS // 4  # of a prompt of token ids, in the log and on the dashboard


class Observe(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        self.metrics, _ = services.lease.hold("metrics:requests", RequestMetrics)
        services.registry.register(self.metrics)

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        assert job.target is not None
        log_prompts, backend = self.services.config.server.log_prompts, job.target.backend.name
        prompt = _prompt(job.request) if log_prompts else None
        line = RequestLine(job.caller.path, job.model, backend, prompt, streamed=job.request.stream)
        if job.caller.request_id:
            line.name = job.caller.request_id
        error: BaseException | None = None
        streamed = job.request.stream  # a one-answer request is folded whole, empty chunks and all
        try:
            with self.metrics.observe(job.caller.path, job.target.label, backend) as seen:
                self.services.inflight.watch(job.caller.request_id, job.model, backend, seen)
                seen.tenant = job.caller.tenant
                if prompt is not None:
                    seen.prompt = prompt[:_PROMPT_CHARS]
                try:
                    async with contextlib.aclosing(next(job)) as rest:
                        async for chunk in rest:
                            if not chunk.empty:  # not yet the answer: time to first token waits on
                                seen.chunk(chunk)
                                line.chunk(chunk, job.outcome.cache)
                            elif streamed:
                                continue
                            yield chunk
                finally:
                    seen.cache = job.outcome.cache
        except BaseException as e:
            error = e
            raise
        finally:
            line.end(seen.status, error, self.services.inflight.ended_by(job.caller.request_id))


def _prompt(req: Request) -> str:
    if isinstance(req, CompletionRequest):
        return req.prompt if req.prompt_ids is None else _ids(req.prompt_ids)
    return next((m.content for m in reversed(req.messages) if m.role == "user"), "")


def _ids(ids: list[int]) -> str:
    """The first ids and how many more: the first alone read as the whole prompt (an 8,191-id prompt as 75 ids)."""
    more = len(ids) - _IDS_SHOWN
    return f"token ids {ids[:_IDS_SHOWN]}" + (f" and {more} more" if more > 0 else "")
