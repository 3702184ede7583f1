"""The request path below the dialects: a job passes through the stages in order, each wrapping the rest.

    resolve -> observe -> limit -> keep loaded -> edit context -> fit -> one tool call -> cache -> repair
      -> offer tools -> coalesce -> admit -> call backend

Every stage sees the internal model only (adapters.protocol), so every dialect and every backend share it. A new
stage is one file in proxy/stages/ (see stages/base.py) and one line in STAGES. The stages that only prepare the job
(resolve, keep loaded, edit context, fit, offer tools, admit), and those a job does not need, run in one generator
between the stages that wrap the stream: a plain chat's chunks pass three layers here, not six.
"""
from __future__ import annotations

import contextlib
import functools
from typing import AsyncIterator, TypeVar

from adapters.protocol import Chunk, EmbedRequest, EmbedResult

from .config import Config
from .embeddings import Embeddings
from .inflight import InFlight
from .job import Caller, Job
from .keep import Lease
from .metrics import new_registry
from .router import Router
from .stages.admit import Admit
from .stages.base import Next, Prepare, Services, Stage
from .stages.cache import Cache
from .stages.call_backend import CallBackend
from .stages.coalesce import Coalesce
from .stages.edit_context import EditContext
from .stages.fit import Fit
from .stages.keep_loaded import KeepLoaded
from .stages.limit import Limit
from .stages.observe import Observe
from .stages.offer_tools import OfferTools
from .stages.one_call import OneToolCall
from .stages.repair import Repair
from .stages.resolve import Resolve

STAGES: tuple[type[Stage], ...] = (Resolve, Observe, Limit, KeepLoaded, EditContext, Fit, OneToolCall,
                                   Cache, Repair, OfferTools, Coalesce, Admit, CallBackend)
S = TypeVar("S", bound=Stage)


class Pipeline:
    def __init__(self, config: Config, router: Router, lease: Lease) -> None:
        inflight, _ = lease.hold("inflight", InFlight, _close_inflight)
        self.services = Services(config, router, new_registry(), lease, inflight)
        self.services.registry.register(inflight)
        self.stages = [cls(self.services) for cls in STAGES]
        self.residency = self.stage(KeepLoaded).residency
        self.limit = self.stage(Limit)
        self.request_metrics = self.stage(Observe).metrics
        self.embeddings = Embeddings(self.services, self.request_metrics, self.residency, self.limit,
                                     self.stage(Admit))
        self._prepares = tuple(isinstance(s, Prepare) for s in self.stages)
        self._nexts: list[Next] = [functools.partial(self._rest, i + 1) for i in range(len(self.stages))]

    @property
    def registry(self):
        return self.services.registry

    def stage(self, cls: type[S]) -> S:
        return next(s for s in self.stages if isinstance(s, cls))

    @property
    def inflight(self) -> InFlight:
        return self.services.inflight

    async def start(self) -> None:
        """Every stage opens before any starts: a reload whose cache tier did not open was refused after the limit
        stage had put its limits (and the list its long_request_s) in force for the configuration that stayed."""
        for stage in self.stages:
            await stage.open()
        await self.inflight.start(self.services.config.server.long_request_s)
        for stage in self.stages:
            await stage.start()
        await self.embeddings.start()

    async def close(self) -> None:
        await self.embeddings.close()
        for stage in reversed(self.stages):
            await stage.close()

    def generate(self, job: Job) -> AsyncIterator[Chunk]:
        """The answer's stream itself, not a wrapper around it, so closing it cancels the backend's work at once."""
        return self._rest(0, job)

    def _rest(self, i: int, job: Job) -> AsyncIterator[Chunk]:
        """The pipeline from stage `i` on: the first stage the job needs, with the rest as its `next`, or, from a
        stage that prepares, the generator that runs the stages up to the next one that wraps the stream."""
        while True:
            stage = self.stages[i]
            if self._prepares[i]:
                return self._prepared(i, job)
            if stage.wraps(job):  # the last, call backend, always does
                return stage(job, self._nexts[i])
            i += 1

    async def _prepared(self, i: int, job: Job) -> AsyncIterator[Chunk]:
        """Stages from `i` (one that prepares) up to the first that wraps the stream, in one generator: each
        preparing stage's `prepare` in turn, what they hold held until the rest's stream ends."""
        async with contextlib.AsyncExitStack() as held:
            while True:
                stage = self.stages[i]
                if self._prepares[i]:
                    job = await stage.prepare(job, held)  # type: ignore[attr-defined]
                elif stage.wraps(job):
                    break
                i += 1
            async with contextlib.aclosing(stage(job, self._nexts[i])) as rest:
                async for chunk in rest:
                    yield chunk

    async def embed(self, req: EmbedRequest, caller: Caller) -> tuple[EmbedResult, dict[str, str]]:
        return await self.embeddings.embed(req, caller)


async def _close_inflight(inflight: InFlight) -> None:
    await inflight.close()
