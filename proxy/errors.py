"""Every error in the client's own dialect, decided by the URL path, from one middleware."""
from __future__ import annotations

import asyncio
import math
import logging

from aiohttp import web

from adapters.errors import NotFound, VeloError

from .auth import Handler
from .dialects import anthropic, dialect_of, ollama, openai
from .http_io import json_response

log = logging.getLogger("velo")


def error_response(err: VeloError, dialect: str) -> web.Response:
    headers = {"Retry-After": str(max(1, math.ceil(err.retry_after)))} if err.retry_after is not None else {}
    headers |= getattr(err, "headers", {})  # a per-key limit's state (proxy/limits.py)
    if dialect == "anthropic":
        return json_response(anthropic.error_object(err), status=anthropic.error_status(err), headers=headers)
    body = ollama.error_object(err.message) if dialect == "ollama" else openai.error_object(err, dialect)
    return json_response(body, status=err.status, headers=headers)


@web.middleware
async def errors_in_dialect(request: web.Request, handler: Handler) -> web.StreamResponse:
    dialect = dialect_of(request.path)
    try:
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
