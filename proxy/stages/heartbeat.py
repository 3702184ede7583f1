"""A stream the backend is still working on keeps its client: after `server.heartbeat_s` without anything to send,
a heartbeat chunk goes up, which the route writes as its dialect's empty event (and, the first time, the headers).

The stages below send an empty chunk as a sign of life: llama-server's progress through a long prompt (a 12k-token
prompt took 310 s on 2 CPU cores), and the repair stage's tool call or JSON held back while the model writes it
(minutes for a file-sized call). With nothing sent, not even headers, the openai Agents SDK gave up at its 300 s
read timeout; nginx's default is 60 s. A stream that begins within `heartbeat_s` is unchanged, errors before its
first byte keep their status; after a heartbeat an error is the stream's error event.
"""
from __future__ import annotations

import contextlib
import time
from typing import AsyncIterator

from adapters.protocol import Chunk

from ..job import Job
from .base import Next, Stage


class Heartbeat(Stage):
    def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        """A one-answer request has no stream to keep: the rest of the pipeline's as is (see stages/base.py)."""
        every = self.services.config.server.heartbeat_s
        if not job.request.stream or every <= 0:
            return next(job)
        return _beating(next(job), every)


async def _beating(stream: AsyncIterator[Chunk], every: float) -> AsyncIterator[Chunk]:
    """Empty chunks are dropped, one turned into a heartbeat when `every` seconds passed without a chunk sent."""
    sent = time.monotonic()
    async with contextlib.aclosing(stream) as rest:  # type: ignore[type-var]
        async for chunk in rest:
            now = time.monotonic()
            if not chunk.empty:
                sent = now
                yield chunk
            elif now - sent >= every:
                sent = now
                yield Chunk(heartbeat=True)
