"""Velo's own admin routes under /velo/ (behind the API key when `[server] api_keys` is set): the requests in
flight, and cancelling one of them (proxy/inflight.py). Where keys are set and no `admin_keys`, any key gets here,
and each sees and cancels only its own requests: no request sees another key's data."""
from __future__ import annotations

from aiohttp import web

from adapters.errors import NotFound

from .auth import CALLER, viewer
from .http_io import json_response
from .inflight import Cancelled
from .state import GENERATION, PIPELINE


def _viewer(request: web.Request) -> str | None:
    return viewer(request[CALLER], request[GENERATION].config.server)


async def requests(request: web.Request) -> web.Response:
    """The requests being served that the caller may see, oldest first: id, route, client, models, backends,
    seconds, tokens so far."""
    return json_response({"requests": request[PIPELINE].inflight.views(_viewer(request))})


async def cancel(request: web.Request) -> web.Response:
    """Ends a request the caller sees: a stream gets its dialect's error event, an answer not yet started a 499 error;
    either way the backend's work is cancelled. Another key's request answers as an unknown id, so that none is
    probed."""
    request_id = request.match_info["id"]
    seen = _viewer(request)  # a key that sees only its own requests cancels its own: no administrator did
    why = Cancelled("cancelled by an administrator" if seen is None else "cancelled by its own key")
    if not request[PIPELINE].inflight.cancel(request_id, why, seen):
        raise NotFound(f"no request {request_id!r} is in flight")
    return json_response({"id": request_id, "cancelled": True})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/velo/requests", requests)
    app.router.add_delete("/velo/requests/{id}", cancel)
