"""The live dashboard: `GET /ui` serves a page shipped in the package (proxy/ui/, no CDN) that polls `/ui/state`, a
JSON snapshot of the collectors /metrics reads (proxy/dashboard.py). Behind the API key when keys are set: a
browser asks for it with its own login box (HTTP Basic, the key as the password; proxy/auth.py)."""
from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from adapters.base import Backend

from .dashboard import BackendView, samples, snapshot
from .http_io import json_response
from .stages.observe import Observe
from .state import GENERATION

UI_DIR = Path(__file__).parent / "ui"
_PROBE_S = 2.0  # a backend slow to list its loaded models shows none rather than stalling the page


async def page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(UI_DIR / "index.html", headers={"Cache-Control": "no-cache"})


async def state(request: web.Request) -> web.Response:
    from .app import APP_METRICS  # the app factory registers this module's routes
    generation = request[GENERATION]
    names = list(generation.backends)
    health, loaded = await asyncio.gather(generation.health(),
                                          asyncio.gather(*(_loaded(generation.backends[n]) for n in names)))
    views = [BackendView(n, generation.backends[n].config.kind, health[n], models) for n, models in zip(names, loaded)]
    metrics = generation.pipeline.stage(Observe).metrics
    found = samples([generation.pipeline.registry, request.app[APP_METRICS]])
    recent = metrics.recent.last(prompts=generation.config.server.log_prompts)
    return json_response(snapshot(found, views, generation.number, recent, metrics.recent.series()),
                         headers={"Cache-Control": "no-store"})


async def _loaded(backend: Backend) -> list[str]:
    """Models the backend holds in memory now (Ollama's /api/ps; the model of a running llama-server)."""
    try:
        return [m.name for m in await asyncio.wait_for(backend.running(), _PROBE_S)]
    except Exception:  # noqa: BLE001 - a backend that cannot say shows none; its health says why
        return []


def add_routes(app: web.Application) -> None:
    app.router.add_get("/ui", page)
    app.router.add_get("/ui/state", state)
    app.router.add_static("/ui/static", UI_DIR)
