"""How the offered tools reach the model, never silently dropped (X-Velo-Tools says which way):

- "native": the model's template renders tools (Qwen2.5, Llama 3.1+, Hermes-style; an Ollama model with the `tools`
  capability; any OpenAI-compatible server), so the backend gets them as they are;
- "prompt": the template ignores them (SmolLM2's, many GGUFs'), so the adapter writes them into the conversation
  (adapters/tool_prompt.py) and the repair stage reads the calls back from the text; the engine still constrains
  every call the model starts to the offered tools' schemas;
- "grammar": a call is required (`tool_choice` "required" or a named tool) and the output is constrained to one:
  by the backend where it enforces tool_choice (the engine, vLLM, SGLang), else by asking for the call's JSON
  Schema as the output format (llama-server and Ollama would answer in prose).
Runs after the repair stage, so repair sees the client's request and the model's raw answer.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import AsyncIterator

from adapters.protocol import ChatRequest, Chunk

from ..job import Job
from ..tools.offer import as_offered
from ..tools.stream import offered_tools
from .base import Next, Stage


class OfferTools(Stage):
    def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        """No tools: the rest of the pipeline's stream as is (see stages/base.py)."""
        req = job.request
        tools = offered_tools(req) if isinstance(req, ChatRequest) else []
        return self._offering(job, req, next) if tools else next(job)  # type: ignore[arg-type]

    async def _offering(self, job: Job, req: ChatRequest, next: Next) -> AsyncIterator[Chunk]:
        job = await self._offered(job, req)
        async with contextlib.aclosing(next(job)) as rest:
            async for chunk in rest:
                yield chunk

    async def _offered(self, job: Job, req: ChatRequest) -> Job:
        assert job.target is not None
        info = await self.services.router.model_info(job.target)
        offered, job.outcome.tools = as_offered(req, info, job.target.backend.forces_tool_choice)
        return job if offered is req else replace(job, request=offered)
