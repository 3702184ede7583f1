"""Reading request bodies, making jobs of them, and writing JSON, NDJSON and SSE answers.

A stream's first chunk is awaited before any byte is sent, so a backend that fails early gives a proper HTTP
error status; a failure after that ends the stream with the dialect's error line. Whatever happens, the
backend stream is closed, which cancels the backend's work.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import orjson
from aiohttp import web

from adapters.errors import BadRequest, PayloadTooLarge, VeloError

from .auth import CALLER
from .cache.policy import bypass_requested
from .dialects import dialect_of
from .job import Job, Request
from .streams import first_then_rest

log = logging.getLogger("velo.http")


async def read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise PayloadTooLarge(f"request body is larger than the limit of {request.client_max_size} bytes") from e
    if not raw:
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from e


def job_for(request: web.Request, req: Request, body: dict[str, Any]) -> Job:
    """The pipeline's job for a parsed request: who asks, in which dialect, and whether they asked Velo to leave its
    cache alone."""
    return Job(req, request[CALLER], dialect_of(request.path), cache_bypass=bypass_requested(request.headers, body))


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json", headers=headers)


async def write_stream(request: web.Request, stream: AsyncIterator[Any], encode: Callable[[Any], bytes],
                       on_error: Callable[[VeloError], bytes], content_type: str,
                       headers: Callable[[], dict[str, str]] = dict, trailer: bytes = b"",
                       finish: Callable[[], Awaitable[bytes]] | None = None) -> web.StreamResponse:
    """Streams `stream` item by item through `encode`; the first item is awaited before the headers (`headers()`,
    read then: the pipeline has decided the cache outcome by its first chunk) go out."""
    try:
        first, rest = await first_then_rest(stream)
        resp = web.StreamResponse(headers={"Content-Type": content_type, "Cache-Control": "no-cache", **headers()})
        await resp.prepare(request)
        try:
            if first is not None:
                await resp.write(encode(first))
            async for item in rest:
                await resp.write(encode(item))
            if finish is not None:
                await resp.write(await finish())
            await resp.write(trailer)
        except VeloError as err:
            log.warning("stream for %s failed mid-way: %s", request.path, err.message)
            await resp.write(on_error(err))
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the client went away: closing the stream below cancels the backend work
        await resp.write_eof()
        return resp
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


def ndjson(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
