"""Each request holds its model loaded while it runs and sets how long it stays after (proxy/residency.py)."""
from __future__ import annotations

from contextlib import AsyncExitStack

from adapters import keep_alive

from ..job import Job
from ..residency import Residency
from .base import Prepare, Services


class KeepLoaded(Prepare):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        # one through config reloads: each configuration had its own, so after a reload an engine's model was never
        # unloaded when its keep_alive ran out, /api/ps lost its expiry, and a `keep_alive: 0` on the new one
        # unloaded the model under requests still running on the old one
        self.residency, _ = services.lease.hold("residency", Residency, _close)

    async def start(self) -> None:
        await self.residency.adopt(self.services.router.backends.values())
        await self.residency.start()

    async def prepare(self, job: Job, held: AsyncExitStack) -> Job:
        assert job.target is not None
        held.enter_context(self.residency.use(job.target, job.request.keep_alive))
        if keep_alive.unloads(job.request.keep_alive):
            held.callback(self._unload_if_answered_here, job)  # runs first, with the request still in flight
        return job

    def _unload_if_answered_here(self, job: Job) -> None:
        """An answer from the cache never reaches the backend, nor its `keep_alive: 0`: an Ollama backend kept the
        model loaded. The model is unloaded once the requests on it are done, as after a bare unload request."""
        assert job.target is not None
        if job.outcome.cache in ("exact", "semantic"):
            self.residency.unload_after(job.target)


async def _close(residency: Residency) -> None:
    await residency.close()
