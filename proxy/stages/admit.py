"""Per-backend admission (proxy/batching/admission.py): the job holds one of its backend's slots for its whole
stream; autocomplete jumps the queue, and a newer one from the same client at the same place replaces the older."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass
from contextlib import AsyncExitStack
from typing import Iterator

from prometheus_client.core import GaugeMetricFamily

from adapters.base import Backend
from adapters.protocol import CompletionRequest
from adapters.wording import counted

from ..batching import LATENCY_CRITICAL, NORMAL, AdmissionController, Place
from ..batching.config import BatchingConfig
from ..config import Config
from ..job import Job
from ..keep import fingerprint
from .base import Prepare, Services

log = logging.getLogger("velo.pipeline")


def priority(job: Job) -> int:
    """Fill-in-the-middle (a completion with a suffix) is autocomplete: latency-critical."""
    req = job.request
    return LATENCY_CRITICAL if isinstance(req, CompletionRequest) and req.suffix is not None else NORMAL


def supersede_key(job: Job, config: Config) -> str | None:
    """Autocomplete jobs of one client at one place replace each other (when `[batching] supersede_autocomplete`),
    each part of a request its like in the next (a request of `n` choices replaced its own, and was always a 499)."""
    req = job.request
    if priority(job) == LATENCY_CRITICAL and config.batching.supersede_autocomplete:
        assert isinstance(req, CompletionRequest) and req.suffix is not None
        return f"{job.caller.tenant}:{job.caller.client}:autocomplete:{_place(req.prompt, req.suffix)}:{job.part}"
    return None


# Characters of context each way: enough that two files, or two places in one, differ.
_PLACE_CHARS = 256


def _place(prefix: str, suffix: str) -> str:
    """Where an autocomplete is: the text before the cursor's line and after it. Typing on that line (auto-closed
    brackets included) changes neither, so each keystroke's request replaces the last; two editor windows, which
    are one client to Velo (every local one is 127.0.0.1 without X-Velo-Client), are at two places and no longer
    cancel each other's requests. Enter starts a new place: the request before it runs on."""
    before, after = prefix.rpartition("\n")[0][-_PLACE_CHARS:], suffix.partition("\n")[2][:_PLACE_CHARS]
    return hashlib.blake2b(f"{before}\0{after}".encode(), digest_size=8).hexdigest()


class Admit(Prepare):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        self.controllers: dict[str, AdmissionController] = {}
        services.registry.register(self)

    async def start(self) -> None:
        """Sizes each backend's queue from what it reports (e.g. llama-server slots), and as that changes. A server
        the previous configuration named too keeps its queue, whatever else of its settings changed, so requests of
        both configurations share its slots; the queue takes its new size, and its new wait limit for requests that
        queue from then on."""
        batching = self.services.config.batching
        backends = list(self.services.router.backends.values())
        held = [self._queue(b, batching) for b in backends]
        queues = await asyncio.gather(*(opening for opening, _ in held))
        kept = [(b, q) for b, q, (_, fresh) in zip(backends, queues, held) if not fresh]
        for (backend, queue), slots in zip(kept, await asyncio.gather(*(_slots(b) for b, _ in kept))):
            asking, queue.asks = queue.asks, None
            if asking is not None:  # it asks the backend object of an earlier configuration, which closes
                asking.cancel()
            if slots is not None:
                queue.controller.resize(slots)
            elif asking is not None:  # still down, and it never said (a queue of 4 for good): this one is asked
                queue.asks = asyncio.create_task(_ask_again(backend, queue.controller), name=f"slots:{backend.name}")
        for backend, queue in zip(backends, queues):
            queue.controller.max_queue = batching.max_queue
            queue.controller.queue_timeout_s = batching.queue_timeout_s
            self.controllers[backend.name] = queue.controller
            backend.watch_slots(queue.controller.resize)  # a replica set's, as its replicas leave and come back

    def _queue(self, backend: Backend, batching: BatchingConfig) -> tuple[asyncio.Future, bool]:
        async def opened() -> _Queue:
            slots = await _slots(backend)
            controller = AdmissionController(limit=slots or backend.config.max_concurrency or 4,
                                             max_queue=batching.max_queue, queue_timeout_s=batching.queue_timeout_s)
            asks = None if slots else asyncio.create_task(_ask_again(backend, controller), name=f"slots:{backend.name}")
            return _Queue(controller, asks)
        cfg = backend.config  # the server, not how it is asked: a new timeout gave it a second queue beside the first
        server = (cfg.kind, cfg.urls, cfg.model, cfg.command, cfg.options)
        return self.services.lease.hold(f"queue:{backend.name}:{fingerprint(server)}",
                                        lambda: asyncio.ensure_future(opened()), _closed)

    async def prepare(self, job: Job, held: AsyncExitStack) -> Job:
        assert job.target is not None
        if (controller := self.controllers.get(job.target.backend.name)) is not None:
            await held.enter_async_context(controller.slot(priority(job), job.caller.client,
                                                           supersede_key(job, self.services.config), job.place))
        return job

    def reserve(self, backend: Backend) -> Place | None:
        """A place in `backend`'s queue taken now, or Overloaded with Retry-After (AdmissionController.reserve), for
        a background response. It may wait for its slot as long as the backend may take over an answer
        (`total_timeout`, 1,800 s by default), or `queue_timeout_s` where that is longer: its client polls, and
        OpenAI keeps such a response `queued` until it runs. `queue_timeout_s` (300 s) is set for a client waiting on
        its connection, whose SDK gives up at 600 s; a background response failed after it, with
        rate_limit_exceeded, which nothing retries, and its work was lost."""
        if (controller := self.controllers.get(backend.name)) is None:
            return None
        if backend.config.total_timeout <= controller.queue_timeout_s:
            return controller.reserve(controller.queue_timeout_s, "[batching] queue_timeout_s")
        return controller.reserve(backend.config.total_timeout, f"backend {backend.name}'s total_timeout, for a "
                                  "background response")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queued = GaugeMetricFamily("velo_queue_depth", "Requests waiting for a backend slot", labels=["backend"])
        running = GaugeMetricFamily("velo_in_flight", "Requests holding a backend slot", labels=["backend"])
        limit = GaugeMetricFamily("velo_backend_slots", "Backend concurrency limit", labels=["backend"])
        for name, ctl in self.controllers.items():
            queued.add_metric([name], ctl.queued)
            running.add_metric([name], ctl.running)
            limit.add_metric([name], ctl.limit)
        yield from (queued, running, limit)


_SLOTS_TIMEOUT_S = 5.0  # a backend that hangs at startup must not hold Velo's start for its total_timeout
_SLOTS_AGAIN_S = 10.0  # how often a backend that could not say its slots is asked again


@dataclass
class _Queue:
    """A backend's queue, and the task asking a backend that was down at startup for its slots until it says."""

    controller: AdmissionController
    asks: asyncio.Task | None = None


async def _closed(opening: asyncio.Future) -> None:
    queue = await opening
    if queue.asks is not None:
        queue.asks.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await queue.asks


async def _slots(backend: Backend, quiet: bool = False) -> int | None:
    """What the backend reports; None when it cannot say (down, hung): the queue then starts with its configured
    limit or 4, and `_ask_again` asks until it says (a llama-server started after Velo kept 4 slots for good)."""
    try:
        return max(1, await asyncio.wait_for(backend.concurrency(), _SLOTS_TIMEOUT_S))
    except Exception as e:  # noqa: BLE001 - a backend that is down must not stop Velo from starting
        if not quiet:
            log.warning("backend %r did not report its concurrency (%s); using %d until it does", backend.name, e,
                        backend.config.max_concurrency or 4)
        return None


async def _ask_again(backend: Backend, controller: AdmissionController) -> None:
    slots = None
    while slots is None:
        await asyncio.sleep(_SLOTS_AGAIN_S)
        slots = await _slots(backend, quiet=True)
    log.info("backend %r reports %s", backend.name, counted(slots, "slot"))
    controller.resize(slots)
