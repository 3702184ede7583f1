"""What the job really asks, and of which backend, before anything that needs to know either (the cache keys the
settled request): the model name through its preset (proxy/presets.py) and the router (proxy/router.py), and every
sampling option the request leaves unset filled from, in order, the preset's parameters, the model's `[models]`
table in config.toml, and the defaults the dialect's own server applies (adapters/options.py), unless the backend
fills in those very defaults itself (Ollama, for the Ollama dialect)."""
from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace

from adapters import options
from adapters.copies import replaced
from adapters.protocol import ChatRequest, Message

from ..job import Job, Request
from ..presets import Preset, by_spelling
from .base import Prepare


class Resolve(Prepare):
    async def prepare(self, job: Job, held: AsyncExitStack) -> Job:
        router = self.services.router
        preset = router.presets.get(job.model)
        job.target = await router.resolve(job.model)
        settled = self._settled(job, preset)
        return job if settled is job.request else replaced(job, request=settled)

    def _settled(self, job: Job, preset: Preset | None) -> Request:
        assert job.target is not None
        req, opts = job.request, job.request.options
        if preset is not None:
            req, opts = with_prompt(req, preset), options.under(opts, preset.options)
        names = (job.model, preset.base if preset else "", job.target.model)
        if (settings := by_spelling(self.services.config.models, *names)) is not None:
            opts = options.under(opts, settings.sampling())
        if job.target.backend.own_defaults != job.dialect:
            opts = options.under(opts, options.defaults(job.dialect))
        return req if opts is req.options else replaced(req, options=opts)


def with_prompt(req: Request, preset: Preset) -> Request:
    """The preset's system prompt where the request has none, its messages before the chat's, and its template for
    a prompt that is not raw, as Ollama applies a Modelfile's SYSTEM, MESSAGE and TEMPLATE."""
    if isinstance(req, ChatRequest):
        messages = [*preset.history, *req.messages]
        if preset.system and not any(m.role == "system" for m in req.messages):  # "": a SYSTEM cleared
            messages.insert(0, Message(role="system", content=preset.system))
        return req if len(messages) == len(req.messages) else replace(req, messages=messages)
    if req.raw:
        return req
    return replace(req, system=req.system if req.system is not None else preset.system or None,
                   template=req.template if req.template is not None else preset.template)
