"""The aiohttp app factory: routes registered in one place, state in AppKeys, backends opened and closed by
`cleanup_ctx`, every error turned into the client's dialect by one middleware."""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web

from adapters.base import Backend
from adapters.errors import NotFound, VeloError

from . import routes_ollama, routes_openai
from .browser_guard import OriginPolicy, guard
from .cache import CacheLayer
from .config import Config
from .context import context_for
from .http_io import dialect_of, error_response, json_response
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .pipeline import Pipeline
from .router import Router
from .state import BACKENDS, CONFIG, CONTEXT, PIPELINE, ROUTER

log = logging.getLogger("velo")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = frozenset({"/", "/health", "/ready", "/metrics"})


@web.middleware
async def errors_in_dialect(request: web.Request, handler: Handler) -> web.StreamResponse:
    dialect = dialect_of(request.path)
    try:
        if request.path not in _OPEN_PATHS:
            request[CONTEXT] = context_for(request, request.app[CONFIG].server.api_keys)
        return await handler(request)
    except VeloError as err:
        return error_response(err, dialect)
    except web.HTTPNotFound:
        return error_response(NotFound(f"no route for {request.method} {request.path}"), dialect)
    except web.HTTPMethodNotAllowed as e:
        err = VeloError(f"{request.method} is not allowed on {request.path}; use {', '.join(sorted(e.allowed_methods))}")
        err.status, err.kind = 405, "invalid_request_error"
        return error_response(err, dialect)
    except web.HTTPException:
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(VeloError("internal error in Velo; see its log"), dialect)


async def health(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    backends = request.app[BACKENDS]
    states = dict(zip(backends, await asyncio.gather(*(_healthy(b) for b in backends.values()))))
    ok = any(states.values()) or not states
    return json_response({"status": "ready" if ok else "unavailable", "backends": states}, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[PIPELINE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def _healthy(backend: Backend) -> bool:
    try:
        return await asyncio.wait_for(backend.health(), 2.0)
    except Exception:  # noqa: BLE001 - a health probe reports, it does not raise
        return False


async def _backends_ctx(app: web.Application) -> AsyncIterator[None]:
    """Backends open first, then the layers that ask them things (slots) or load models (semantic cache)."""
    backends, pipeline, config = app[BACKENDS], app[PIPELINE], app[CONFIG]
    await asyncio.gather(*(b.start() for b in backends.values()))
    await pipeline.start()
    if config.cache.enabled:
        pipeline.cache = await CacheLayer.create(config.cache)
    yield
    await pipeline.close()
    await asyncio.gather(*(b.close() for b in backends.values()), return_exceptions=True)


def make_app(config: Config, backends: dict[str, Backend] | None = None) -> web.Application:
    """Builds the app; `backends` may be given ready-made (tests), else they come from the config."""
    if backends is None:
        from adapters.registry import make_backend
        backends = {b.name: make_backend(b) for b in config.backends}
    browser_guard, add_cors_headers = guard(OriginPolicy.for_server(config.server.host, config.server.origins))
    app = web.Application(client_max_size=config.server.max_body_bytes,
                          middlewares=[browser_guard, errors_in_dialect])
    app.on_response_prepare.append(add_cors_headers)
    router = Router(config, backends)
    app[CONFIG], app[BACKENDS], app[ROUTER] = config, backends, router
    app[PIPELINE] = pipeline = Pipeline(router, batching=config.batching, tools=config.tools)
    pipeline.metrics.watch(pipeline)
    app.cleanup_ctx.append(_backends_ctx)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    routes_ollama.add_routes(app)
    routes_openai.add_routes(app)
    return app
