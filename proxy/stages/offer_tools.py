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

from contextlib import AsyncExitStack
from dataclasses import replace

from adapters.protocol import ChatRequest

from ..job import Job
from ..tools.offer import as_offered
from ..tools.stream import offered_tools
from .base import Prepare


class OfferTools(Prepare):
    async def prepare(self, job: Job, held: AsyncExitStack) -> Job:
        req = job.request
        if not isinstance(req, ChatRequest) or not offered_tools(req):
            return job
        assert job.target is not None
        info = await self.services.router.model_info(job.target)
        offered, job.outcome.tools = as_offered(req, info, job.target.backend.forces_tool_choice)
        return job if offered is req else replace(job, request=offered)
