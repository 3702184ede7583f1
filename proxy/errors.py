"""Every error in the client's own dialect, decided by the URL path, from one middleware; a path with no route but for
a trailing slash is sent to the one without, as Ollama's router does."""
from __future__ import annotations

import asyncio
import math
import logging

from aiohttp import web

from adapters.errors import Answered, NotFound, VeloError

from .auth import Handler
from .dialects import anthropic, dialect_of, ollama, openai
from .http_io import STREAM, json_response
from .inflight import ending_reason, request_id, uncancel

log = logging.getLogger("velo")


def error_response(err: VeloError, dialect: str, headers: dict[str, str] | None = None,
                   request_id: str | None = None) -> web.Response:
    """`request_id`: named by an Anthropic error, in its body and its `request-id` header, as Anthropic's are."""
    headers = {**(headers or {}), **getattr(err, "headers", {})}  # a per-key limit's state (proxy/limits.py)
    if isinstance(err, Answered):
        return web.Response(body=err.body, status=err.status, content_type="application/json", headers=headers)
    if err.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after)))
    if err.repeats:
        headers["x-should-retry"] = "false"
    if dialect == "anthropic":
        if request_id is not None:
            headers["request-id"] = request_id
        return json_response(anthropic.error_object(err, request_id), status=anthropic.error_status(err),
                             headers=headers)
    body = ollama.error_object(err) if dialect == "ollama" else openai.error_object(err, dialect)
    return json_response(body, status=err.status, headers=headers)


@web.middleware
async def errors_in_dialect(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except asyncio.CancelledError:
        reason = ending_reason(request)  # Velo ended the request itself (an admin, a shutdown): say so
        if reason is None:
            raise
        uncancel()
        return request.get(STREAM) or _answer(request, reason)
    except ConnectionResetError:
        raise
    except web.HTTPNotFound as e:
        return await _without_trailing_slash(request) or _answer(request, e)
    except Exception as e:
        if (streamed := request.get(STREAM)) is not None:  # its answer is out: never a second one in its stream
            log.exception("error on %s %s after its stream ended", request.method, request.path)
            return streamed
        return _answer(request, e)


async def _without_trailing_slash(request: web.Request) -> web.StreamResponse | None:
    """Ollama's router (gin's RedirectTrailingSlash) sends `/api/tags/` to `/api/tags`: 301 for a GET, 307 (the
    method and body kept) for any other method; a client with a base URL ending in `/` otherwise met a 404."""
    path = request.path
    if len(path) < 2 or not path.endswith("/"):
        return None
    moved = request.rel_url.with_path(path.rstrip("/") or "/", keep_query=True)
    if (await request.app.router.resolve(request.clone(rel_url=moved))).http_exception is not None:
        return None
    status = 301 if request.method == "GET" else 307
    return web.Response(status=status, headers={"Location": str(moved)})


def _answer(request: web.Request, e: Exception) -> web.StreamResponse:
    dialect = dialect_of(request.path, request.headers)
    rid = request_id(request) if dialect == "anthropic" else None
    if isinstance(e, VeloError):
        return error_response(e, dialect, request_id=rid)
    if isinstance(e, web.HTTPNotFound):
        return error_response(NotFound(f"no route for {request.method} {request.path}"), dialect, request_id=rid)
    if isinstance(e, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(e.allowed_methods))
        err = VeloError(f"{request.method} is not allowed on {request.path}; use {allowed}")
        err.status, err.kind = 405, "invalid_request_error"
        return error_response(err, dialect, {"Allow": allowed}, request_id=rid)
    if isinstance(e, web.HTTPException):
        raise e
    log.exception("unexpected error on %s %s", request.method, request.path)
    return error_response(VeloError("internal error in Velo; see its log"), dialect, request_id=rid)
