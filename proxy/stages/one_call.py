"""`parallel_tool_calls: false` (OpenAI) and `disable_parallel_tool_use` (Anthropic): at most one tool call comes
back. Models answer with several calls where a client runs one a turn (vLLM issue #9451: Llama 3.1 8B sent three,
which broke LangGraph); as vLLM does it (PR #26233), the first call is kept and the rest dropped, named in
X-Velo-Repair when the answer is not streamed. Runs above the cache, so one cached answer serves both settings."""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import AsyncIterator

from adapters.protocol import ChatRequest, Chunk

from ..job import Job
from .base import Next, Stage


class OneToolCall(Stage):
    def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        """Parallel calls allowed (the default): the rest of the pipeline's stream as is (see stages/base.py)."""
        req = job.request
        if not isinstance(req, ChatRequest) or req.parallel_tool_calls or not req.tools:
            return next(job)
        return self._first_call(job, next)

    async def _first_call(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        kept = dropped = 0
        try:
            async with contextlib.aclosing(next(job)) as rest:
                async for chunk in rest:
                    if chunk.tool_calls and kept + len(chunk.tool_calls) > 1:
                        calls = chunk.tool_calls[:1 - kept]
                        dropped += len(chunk.tool_calls) - len(calls)
                        chunk = replace(chunk, tool_calls=calls)
                    kept += len(chunk.tool_calls)
                    yield chunk
        finally:
            if dropped:
                job.outcome.repairs.append(f"parallel_calls_dropped={dropped}")
