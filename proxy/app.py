"""The aiohttp app factory: routes registered in one place, state in AppKeys, the configuration in force as a
`Generation` each request is pinned to (proxy/generation.py), reloaded from `config_path` when it changes
(proxy/reload.py); middlewares: the count of requests that reach no model, the browser guard, errors in the client's
dialect, the declared body size, the pin, authentication, the list of requests in flight."""
from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

from aiohttp import web
from prometheus_client import CollectorRegistry

from adapters.base import Backend

from . import (routes_anthropic, routes_llama, routes_models, routes_ollama, routes_ollama_cloud, routes_openai,
               routes_presets, routes_responses, routes_ui, routes_velo)
from .auth import Handler, authenticate
from .browser_guard import OriginPolicy, guard
from .config import Config
from .errors import errors_in_dialect
from .generation import Generation, Generations
from .http_io import json_response
from .inflight import RUNNING, is_listed, request_id
from .keep import Keep
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, new_registry, render
from .reload import Reloader
from .request_bounds import refuse_oversized
from .background import BackgroundRuns
from .dialects.documents import Documents
from .live_responses import LiveResponses
from .responses_store import ResponseStore
from .state import BACKGROUND, DOCUMENTS, GENERATION, GENERATIONS, LIVE, PIPELINE, RELOADER, RESPONSES, ROUTER

APP_METRICS = web.AppKey("app_metrics", CollectorRegistry)  # what outlives generations (config reloads)


async def health(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    states = await request[GENERATION].health()
    ok = any(states.values()) or not states
    return json_response({"status": "ready" if ok else "unavailable", "backends": states}, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    body = render(request[PIPELINE].registry) + render(request.app[APP_METRICS])
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


@web.middleware
async def pin(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Runs the request on the generation current when it arrived, to the end of its answer, streams included."""
    generation = request.app[GENERATIONS].current
    request[GENERATION], request[PIPELINE], request[ROUTER] = generation, generation.pipeline, generation.router
    generation.enter()
    try:
        return await handler(request)
    finally:
        generation.leave()


@web.middleware
async def count_unobserved(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Counts in `velo_requests` the API requests the pipeline's observe stage never saw, under the route asked and no
    model or backend: those refused at the edge (401, 403, 413, a body that does not parse, an unknown model or
    route) and the listings. Without them a storm of 401s from a client with a stale key showed nowhere."""
    status = "499"  # the client left (errors in its dialect answer everything else)
    try:
        response = await handler(request)
        status = str(response.status)
        return response
    finally:
        running = request.get(RUNNING)
        observed = running is not None and (running.jobs or running.observed_apart)
        if is_listed(request.path) and not observed:
            resource = request.match_info.route.resource
            endpoint = resource.canonical if resource is not None else "other"  # bounded: a scanner's paths are not
            request.app[GENERATIONS].current.pipeline.request_metrics.count(endpoint, status)


@web.middleware
async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Lists the request among those in flight (proxy/inflight.py), one list for every configuration."""
    return await request[PIPELINE].inflight.track(request, handler)


async def _request_id(request: web.Request, response: web.StreamResponse) -> None:
    """The request's id under Velo's name and the two its clients' SDKs read (`request_id` of a response or an
    error): OpenAI's `x-request-id` and Anthropic's `request-id`."""
    if is_listed(request.path):
        named = request_id(request)
        response.headers["X-Velo-Request-Id"] = response.headers["x-request-id"] = named
        response.headers["request-id"] = named


async def _responses_ctx(app: web.Application) -> AsyncIterator[None]:
    """The stored responses, the background ones being written, which end (stored as cancelled) first, and the
    streamed ones being written."""
    app[RESPONSES] = await ResponseStore.open(app[GENERATIONS].current.config.responses)
    app[BACKGROUND] = BackgroundRuns()
    app[LIVE] = LiveResponses()
    yield
    await app[BACKGROUND].close()
    await app[RESPONSES].close()


async def _documents_ctx(app: web.Application) -> AsyncIterator[None]:
    app[DOCUMENTS] = Documents()
    yield
    app[DOCUMENTS].close()


def make_app(config: Config, backends: dict[str, Backend] | None = None,
             config_path: str | Path | None = None) -> web.Application:
    """Builds the app; `backends` may be given ready-made (tests), else they come from the config. With
    `config_path`, edits of that file (or `reload()`, which SIGHUP calls) change the configuration live."""
    keep = Keep()
    generations = Generations(Generation.build(1, config, keep, backends))
    browser_guard, add_cors_headers = guard(OriginPolicy.for_server(config.server.host, config.server.origins))
    app = web.Application(client_max_size=config.server.max_body_bytes,
                          middlewares=[count_unobserved, browser_guard, errors_in_dialect, refuse_oversized, pin,
                                       authenticate(lambda r: r[GENERATION].config.server), track])
    app.on_response_prepare.append(add_cors_headers)
    app.on_response_prepare.append(_request_id)
    app[GENERATIONS], app[APP_METRICS] = generations, new_registry()
    app.cleanup_ctx.append(generations.lifetime)
    app.cleanup_ctx.append(_responses_ctx)
    app.cleanup_ctx.append(_documents_ctx)
    if config_path is not None:
        app[RELOADER] = Reloader(config_path, generations, keep)
        app[APP_METRICS].register(app[RELOADER])
        app.cleanup_ctx.append(app[RELOADER].lifetime)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    routes_ollama.add_routes(app)
    routes_ollama_cloud.add_routes(app)
    routes_presets.add_routes(app)
    routes_openai.add_routes(app)
    routes_models.add_routes(app)
    routes_anthropic.add_routes(app)
    routes_responses.add_routes(app)
    routes_llama.add_routes(app)
    routes_ui.add_routes(app)
    routes_velo.add_routes(app)
    return app
