"""What one client may hold of Velo: the time to send a request's headers and body, and the body size it declares.

aiohttp's server closes a connection that has not sent a whole request head within its `keepalive_timeout`,
counted from the connection's start or from its previous answer (aiohttp >= 3.14.4; before, a connection that
never finished its headers was held for good: 300 slowloris connections held 300 descriptors for 90 s and more).
The body is bounded by `body_timeout_s` where handlers read it (http_io.read_json), and a declared
`Content-Length` over `max_body_bytes` is refused before anything is read.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from adapters.errors import BadRequest, PayloadTooLarge, RequestTimeout

from .auth import Handler
from .config import ServerConfig


# After an answer sent before its request body was read (413, 408), aiohttp reads and drops what the client still
# sends, so the answer is not lost to a reset, for this long (its default, 10 s, let a trickling client hold on).
_LINGER_S = 2.0
# The longest request line and header line read: a browser sends every cookie of `localhost`, whatever the port, and
# a developer's (notebooks, dashboards, dev servers) passed aiohttp's 8,190 bytes, a 400 in plain text where Ollama
# (Go's 1 MiB for the whole head) answers. 64 KiB holds such a head many times over.
_HEAD_LINE_BYTES = 64 * 1024


def server_options(server: ServerConfig) -> dict[str, Any]:
    """Keyword arguments for aiohttp's runner that bound how long a connection may take to send its headers, and how
    long each of their lines may be."""
    return {"keepalive_timeout": server.header_timeout_s, "lingering_time": _LINGER_S,
            "max_line_size": _HEAD_LINE_BYTES, "max_field_size": _HEAD_LINE_BYTES}


# Bodies passed on as they arrive, never held by Velo: a model file for Ollama's /api/blobs is many GB
_PASSED_ON = "/api/blobs/"


@web.middleware
async def refuse_oversized(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A declared body over the limit is refused at once (413), before the client sends any of it."""
    declared = request.content_length
    if declared is not None and declared > request.client_max_size and not request.path.startswith(_PASSED_ON):
        raise PayloadTooLarge(f"request body of {declared} bytes is larger than the limit of "
                              f"{request.client_max_size} bytes")
    return await handler(request)


async def read_body(request: web.Request, timeout: float) -> bytes:
    """The whole body within `timeout` seconds (408 after), and within the size limit (413). A body that came whole
    with its head (a short request's) is read without arming a timer: the timer was 1.3% of a short chat request's
    instructions in Velo (2,414 -> 2,383 thousand, callgrind, against the zero-work fake)."""
    try:
        async with contextlib.nullcontext() if request.content.is_eof() else asyncio.timeout(timeout):
            return await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise PayloadTooLarge(f"request body is larger than the limit of {request.client_max_size} bytes") from e
    except RequestPayloadError as e:  # a body its Content-Encoding (gzip, deflate) does not decode: was a 500
        err = BadRequest(f"request body could not be read: {getattr(e.__cause__, 'message', e)}")
        err.headers = {"Connection": "close"}  # aiohttp drops a connection it cannot parse: not to be used again
        raise err from e
    except asyncio.TimeoutError as e:
        raise RequestTimeout(f"the request body did not arrive within {timeout:g}s") from e
