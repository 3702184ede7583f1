"""The aiohttp app factory: routes registered in one place, state in AppKeys, backends opened and closed by
`cleanup_ctx`; middlewares: the browser guard, errors in the client's dialect, authentication."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

from aiohttp import web

from adapters.base import Backend

from . import routes_anthropic, routes_ollama, routes_openai, routes_responses
from .auth import authenticate
from .browser_guard import OriginPolicy, guard
from .config import Config
from .errors import errors_in_dialect
from .http_io import json_response
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, render
from .pipeline import Pipeline
from .router import Router
from .responses_store import ResponseStore
from .state import BACKENDS, CONFIG, PIPELINE, RESPONSES, ROUTER


async def health(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    backends = request.app[BACKENDS]
    states = dict(zip(backends, await asyncio.gather(*(_healthy(b) for b in backends.values()))))
    ok = any(states.values()) or not states
    return json_response({"status": "ready" if ok else "unavailable", "backends": states}, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    body = render(request.app[PIPELINE].registry)
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def _healthy(backend: Backend) -> bool:
    try:
        return await asyncio.wait_for(backend.health(), 2.0)
    except Exception:  # noqa: BLE001 - a health probe reports, it does not raise
        return False


async def _backends_ctx(app: web.Application) -> AsyncIterator[None]:
    """Backends open first, then the stages that ask them things (slots) or load models (semantic cache)."""
    backends, pipeline = app[BACKENDS], app[PIPELINE]
    await asyncio.gather(*(b.start() for b in backends.values()))
    await pipeline.start()
    app[RESPONSES] = await ResponseStore.open(app[CONFIG].responses)
    yield
    await app[RESPONSES].close()
    await pipeline.close()
    await asyncio.gather(*(b.close() for b in backends.values()), return_exceptions=True)


def make_app(config: Config, backends: dict[str, Backend] | None = None) -> web.Application:
    """Builds the app; `backends` may be given ready-made (tests), else they come from the config."""
    if backends is None:
        from adapters.registry import make_backend
        backends = {b.name: make_backend(b) for b in config.backends}
    browser_guard, add_cors_headers = guard(OriginPolicy.for_server(config.server.host, config.server.origins))
    app = web.Application(client_max_size=config.server.max_body_bytes,
                          middlewares=[browser_guard, errors_in_dialect, authenticate(config.server.api_keys)])
    app.on_response_prepare.append(add_cors_headers)
    router = Router(config, backends)
    app[CONFIG], app[BACKENDS], app[ROUTER] = config, backends, router
    app[PIPELINE] = Pipeline(config, router)
    app.cleanup_ctx.append(_backends_ctx)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    routes_ollama.add_routes(app)
    routes_openai.add_routes(app)
    routes_anthropic.add_routes(app)
    routes_responses.add_routes(app)
    return app
