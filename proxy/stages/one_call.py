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
    def wraps(self, job: Job) -> bool:
        """Whether the chat offers tools and allows one call only (parallel calls are the default)."""
        req = job.request
        return isinstance(req, ChatRequest) and not req.parallel_tool_calls and bool(req.tools)

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
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
