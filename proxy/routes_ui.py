"""The live dashboard: `GET /ui` serves a page shipped in the package (proxy/ui/, no CDN) that polls `/ui/state`, a
JSON snapshot of the collectors /metrics reads (proxy/dashboard.py). Behind the API key when keys are set: a
browser asks for it with its own login box (HTTP Basic, the key as the password; proxy/auth.py)."""
from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from adapters.base import Backend
from adapters.errors import NotFound

from .auth import CALLER, viewer
from .dashboard import BackendView, samples, snapshot
from .http_io import json_response
from .stages.observe import Observe
from .state import GENERATION

UI_DIR = Path(__file__).parent / "ui"
_ASSETS = ("app.js", "style.css")
# The page shows strings any client or backend sets (model names, prompts) to a browser that holds an admin key: only
# its own files run, and no other site frames it
_SAFE = {"X-Content-Type-Options": "nosniff",
         "Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"}
# revalidated (an ETag round trip): without it a browser kept app.js fresh for a tenth of its age since Last-Modified,
# days of an old script against a new /ui/state after an upgrade
_FILE_HEADERS = {**_SAFE, "Cache-Control": "no-cache"}
_PROBE_S = 2.0  # a backend slow to list its loaded models shows none rather than stalling the page


async def page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(UI_DIR / "index.html", headers=_FILE_HEADERS)


async def asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    if name not in _ASSETS:
        raise NotFound(f"the dashboard has no file {name!r}")
    return web.FileResponse(UI_DIR / name, headers=_FILE_HEADERS)


async def state(request: web.Request) -> web.Response:
    from .app import APP_METRICS  # the app factory registers this module's routes
    generation = request[GENERATION]
    names = list(generation.backends)
    health, loaded = await asyncio.gather(generation.health(),
                                          asyncio.gather(*(_loaded(generation.backends[n]) for n in names)))
    views = [BackendView(n, generation.backends[n].config.kind, health[n], models) for n, models in zip(names, loaded)]
    metrics = generation.pipeline.stage(Observe).metrics
    found = samples([generation.pipeline.registry, request.app[APP_METRICS]])
    server = generation.config.server
    recent = metrics.recent.last(prompts=server.log_prompts, viewer=viewer(request[CALLER], server))
    return json_response(snapshot(found, views, generation.number, recent, metrics.recent.series()),
                         headers={**_SAFE, "Cache-Control": "no-store"})


async def _loaded(backend: Backend) -> list[str]:
    """Models the backend holds in memory now (Ollama's /api/ps; the model of a running llama-server)."""
    try:
        return [m.name for m in await asyncio.wait_for(backend.running(), _PROBE_S)]
    except Exception:  # noqa: BLE001 - a backend that cannot say shows none; its health says why
        return []


def add_routes(app: web.Application) -> None:
    app.router.add_get("/ui", page)
    app.router.add_get("/ui/state", state)
    app.router.add_get("/ui/static/{name}", asset)
