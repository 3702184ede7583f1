"""Requests in flight: listed (`GET /velo/requests`, each to its own key alone where keys are set and no admin_keys;
two gauges on /metrics; one log line for each that runs past `[server] long_request_s`), cancellable by those who
see it (`DELETE /velo/requests/{id}`), and ended with the client's own error when Velo shuts down.

Every /api and /v1 request gets an id, sent back as `X-Velo-Request-Id`. Ending a request cancels its handler's
task with a reason kept here; the stream writer (http_io.write_stream) and the error middleware (errors.py) turn
that cancel into the dialect's error event or error answer, and the cancel closes the pipeline's stream on its way,
which cancels the backend's work.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily

from adapters.copies import replaced
from adapters.errors import VeloError
from adapters.wording import counted

from .auth import CALLER, OPEN_PATHS, Handler
from .metrics import Observation

log = logging.getLogger("velo.requests")
RUNNING = "velo.running"  # request key: the request's Running entry
_ID = "velo.request_id"  # request key: its id, made when first asked for
ADMIN_PREFIX = "/velo/"  # the routes that look at requests are not requests themselves
_WATCH_EVERY_S = 10.0


class Cancelled(VeloError):
    """An admin ended the request; 499 as for a client that left, which no SDK retries."""

    status = 499
    kind = "request_cancelled"


class ShuttingDown(VeloError):
    """Velo is stopping and the request outlived the grace period: worth retrying once Velo is back."""

    status = 503
    kind = "service_unavailable"


@dataclass
class Running:
    """One request being served; `jobs` are its generations (several with OpenAI's `n`), added by the observe stage."""

    id: str
    method: str
    path: str
    client: str
    tenant: str  # whose request: its key's scope (proxy/auth.py), never shown (routes_velo.viewer: who sees it)
    task: asyncio.Task
    started: float = field(default_factory=time.monotonic)
    jobs: list[tuple[str, str, Observation]] = field(default_factory=list)  # (model, backend, observation)
    reason: VeloError | None = None  # why Velo itself ended it
    logged: bool = False
    observed_apart: bool = False  # its generation is observed in work of its own (a background response's)

    def view(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "method": self.method, "path": self.path, "client": self.client,
                "models": sorted({m for m, _, _ in self.jobs}), "backends": sorted({b for _, b, _ in self.jobs}),
                "seconds": round(now - self.started, 3), "tokens": sum(o.tokens for _, _, o in self.jobs),
                "ending": self.reason is not None}


def new_request_id() -> str:
    """`req_` and 16 hex digits: Anthropic's form of its `request-id`, which the Anthropic dialect sends as it."""
    return "req_" + os.urandom(8).hex()


def request_id(request: web.Request) -> str:
    """The request's id, made when first asked for: by the list of requests in flight, or by the answer to one
    refused before it got there (a 401, 403 or 413 names its id too)."""
    if (made := request.get(_ID)) is None:
        made = request[_ID] = new_request_id()
    return made


def is_listed(path: str) -> bool:
    """Whether a request on `path` is a request Velo lists and names (the status and admin routes are not, nor the
    dashboard: its polls wait on each backend's health probe, and a backend down listed them as requests)."""
    return path not in OPEN_PATHS and not path.startswith(ADMIN_PREFIX) and path != "/ui" \
        and not path.startswith("/ui/")


def ending_reason(request: web.Request) -> VeloError | None:
    """Why Velo cancelled this request's handler (an admin, a shutdown), or None for any other cancel (the client
    left)."""
    running = request.get(RUNNING)
    return running.reason if running is not None else None


def uncancel() -> None:
    """A handler that turns Velo's own cancel into an answer goes on: take the cancel back (asyncio.timeout and
    task groups count them, Python 3.11+)."""
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):
        task.uncancel()


class InFlight:
    def __init__(self) -> None:
        self.long_request_s = 0.0
        self.running: dict[str, Running] = {}
        self._watch: asyncio.Task | None = None

    async def start(self, long_request_s: float) -> None:
        """Each configuration's pipeline starts it with its `long_request_s`: one list across config reloads, and
        the threshold of the newest configuration (a reload that changed it was ignored, without a word)."""
        self.long_request_s = long_request_s
        if long_request_s > 0 and self._watch is None:
            self._watch = asyncio.create_task(self._watch_long())

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Registers the request for as long as its handler runs (inside authentication: it knows the caller)."""
        if not is_listed(request.path):
            return await handler(request)
        task = asyncio.current_task()
        assert task is not None
        caller = request[CALLER]
        entry = Running(request_id(request), request.method, request.path, caller.client, caller.tenant, task)
        request[RUNNING], request[CALLER] = entry, replaced(caller, request_id=entry.id)
        with self.listed(entry):
            return await handler(request)

    @contextmanager
    def listed(self, entry: Running) -> Iterator[None]:
        """`entry` is in the list while the block runs: a request's handler, or work that outlives it (a background
        response, proxy/background.py), which is then cancelled, drained at shutdown and shown as a request is."""
        self.running[entry.id] = entry
        try:
            yield
        finally:
            del self.running[entry.id]

    def watch(self, request_id: str, model: str, backend: str, seen: Observation) -> None:
        """The observe stage reports each generation of a request, so the listing shows its model and tokens."""
        if (entry := self.running.get(request_id)) is not None:
            entry.jobs.append((model, backend, seen))

    def ended_by(self, request_id: str) -> VeloError | None:
        """Why Velo cancelled this request itself, if it did (None: running, or the client left)."""
        entry = self.running.get(request_id)
        return entry.reason if entry is not None else None

    def cancel(self, request_id: str, reason: VeloError, viewer: str | None = None) -> bool:
        """Ends the request, if it runs and is the `viewer` tenant's (None: anyone's)."""
        entry = self.running.get(request_id)
        if entry is None or entry.reason is not None or (viewer is not None and entry.tenant != viewer):
            return False
        entry.reason = reason
        entry.task.cancel()
        log.warning("request %s (%s %s) ended: %s", entry.id, entry.method, entry.path, reason.message)
        return True

    def cancel_all(self, reason: VeloError) -> int:
        return sum(self.cancel(request_id, reason) for request_id in list(self.running))

    async def drained(self, timeout: float, until: asyncio.Event | None = None) -> bool:
        """Waits up to `timeout` (or until `until` is set) for every request to finish; True when none is left."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline and not (until is not None and until.is_set()):
            await asyncio.sleep(0.02)
        return not self.running

    def views(self, viewer: str | None = None) -> list[dict[str, Any]]:
        """Oldest first: those of the `viewer` tenant alone, or (None) every one."""
        now = time.monotonic()
        seen = (r for r in self.running.values() if viewer is None or r.tenant == viewer)
        return sorted((r.view(now) for r in seen), key=lambda v: -v["seconds"])

    async def _watch_long(self) -> None:
        """Until a configuration sets `long_request_s` to 0 (one that sets it again starts another watch)."""
        while True:
            await asyncio.sleep(min(_WATCH_EVERY_S, self.long_request_s))
            if self.long_request_s <= 0:
                self._watch = None
                return
            now = time.monotonic()
            for entry in list(self.running.values()):
                if not entry.logged and now - entry.started > self.long_request_s:
                    entry.logged = True
                    view = entry.view(now)
                    log.warning("request %s (%s %s, models %s, client %r) has run %.0f s and produced %s; "
                                "DELETE /velo/requests/%s cancels it", entry.id, entry.method, entry.path,
                                ",".join(view["models"]) or "-", entry.client, view["seconds"],
                                counted(view["tokens"], "token"), entry.id)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.monotonic()
        oldest = max((now - r.started for r in self.running.values()), default=0.0)
        yield GaugeMetricFamily("velo_requests_running", "Requests being served now (GET /velo/requests lists them)",
                                value=len(self.running))
        yield GaugeMetricFamily("velo_request_oldest_seconds", "Age of the oldest request being served", value=oldest)
