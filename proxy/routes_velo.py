"""Velo's own admin routes under /velo/ (behind the API key when `[server] api_keys` is set): the requests in
flight, and cancelling one of them (proxy/inflight.py)."""
from __future__ import annotations

from aiohttp import web

from adapters.errors import NotFound

from .http_io import json_response
from .inflight import Cancelled
from .state import PIPELINE


async def requests(request: web.Request) -> web.Response:
    """Every request being served, oldest first: id, route, client, models, backends, seconds, tokens so far."""
    return json_response({"requests": request[PIPELINE].inflight.views()})


async def cancel(request: web.Request) -> web.Response:
    """Ends a request: a stream gets its dialect's error event, an answer not yet started a 499 error; either way the
    backend's work is cancelled."""
    request_id = request.match_info["id"]
    if not request[PIPELINE].inflight.cancel(request_id, Cancelled("cancelled by an administrator")):
        raise NotFound(f"no request {request_id!r} is in flight")
    return json_response({"id": request_id, "cancelled": True})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/velo/requests", requests)
    app.router.add_delete("/velo/requests/{id}", cancel)
