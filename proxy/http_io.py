"""Reading request bodies and writing JSON, NDJSON and SSE answers, in the client's own dialect.

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
from adapters.protocol import Chunk

from .cache.policy import bypass_requested
from .context import CONTEXT, RequestContext
from .dialects import ollama, openai

log = logging.getLogger("velo.http")


def dialect_of(path: str) -> str:
    return "openai" if path.startswith("/v1/") or path == "/v1" else "ollama"


async def read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise PayloadTooLarge(f"request body is larger than the limit of {request.client_max_size} bytes") from e
    if not raw:
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from e
    ctx = request.get(CONTEXT)
    if ctx is not None and isinstance(body, dict):
        ctx.cache_bypass = bypass_requested(request.headers, body)
    return body


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json", headers=headers)


def error_response(err: VeloError, dialect: str) -> web.Response:
    body = openai.error_object(err) if dialect == "openai" else ollama.error_object(err.message)
    headers = {"Retry-After": str(max(1, round(err.retry_after)))} if err.retry_after is not None else None
    return json_response(body, status=err.status, headers=headers)


def velo_headers(ctx: RequestContext) -> dict[str, str]:
    headers = {"X-Velo-Cache": ctx.cache_status}
    if ctx.repairs:
        headers["X-Velo-Repair"] = "; ".join(ctx.repairs)[:1000]
    return headers


async def first_then_rest(stream: AsyncIterator[Chunk]) -> tuple[Chunk | None, AsyncIterator[Chunk]]:
    """Awaits the first chunk (errors surface here, before headers) and returns it with the rest."""
    try:
        first = await stream.__anext__()
    except StopAsyncIteration:
        return None, stream
    return first, stream


async def collect(stream: AsyncIterator[Chunk]) -> list[Chunk]:
    try:
        return [c async for c in stream]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def write_stream(request: web.Request, ctx: RequestContext, stream: AsyncIterator[Any],
                       encode: Callable[[Any], bytes], on_error: Callable[[VeloError], bytes],
                       content_type: str, trailer: bytes = b"",
                       finish: Callable[[], Awaitable[bytes]] | None = None) -> web.StreamResponse:
    """Streams `stream` item by item through `encode`; the first item is awaited before the headers go out."""
    try:
        first, rest = await first_then_rest(stream)
        resp = web.StreamResponse(headers={"Content-Type": content_type, "Cache-Control": "no-cache",
                                           **velo_headers(ctx)})
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
