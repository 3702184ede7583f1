"""OpenAI API handlers under /v1: parse -> pipeline -> write. `n > 1` runs n generations side by side."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, AsyncIterator, Callable

from aiohttp import web

from adapters.errors import NotFound
from adapters.protocol import Chunk, aggregate

from .dialects import openai
from .http_io import SSE_DONE, collect, json_response, read_json, sse, velo_headers, write_stream
from .state import CONTEXT, PIPELINE, ROUTER


async def models(request: web.Request) -> web.Response:
    listed = await request.app[ROUTER].list_models()
    return json_response({"object": "list", "data": [openai.model_object(m) for m in listed]})


async def model(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    for info in await request.app[ROUTER].list_models():
        if info.name == name:
            return json_response(openai.model_object(info))
    raise NotFound(f"The model '{name}' does not exist")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req = openai.parse_chat(body)
    ctx, pipeline = request[CONTEXT], request.app[PIPELINE]
    streams = [pipeline.chat(_nth(req, i), ctx) for i in range(req.n)]
    ids = openai.ChatIds("chatcmpl")
    if not req.stream:
        choices = [aggregate(c) for c in await asyncio.gather(*(collect(s) for s in streams))]
        return json_response(openai.chat_completion(ids, req.model, choices), headers=velo_headers(ctx))
    calls_sent = [0] * len(streams)

    def shape(i: int, chunk: Chunk) -> dict:
        obj = openai.chat_chunk(ids, req.model, i, chunk, calls_sent=calls_sent[i])
        calls_sent[i] += len(chunk.tool_calls)
        return obj

    return await _sse(request, streams, shape,
                      openai.stream_options_usage(body), ids, req.model, "chat.completion.chunk", opening=True)


async def completions(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req = openai.parse_completion(body)
    ctx, pipeline = request[CONTEXT], request.app[PIPELINE]
    if req.suffix is not None:
        ctx.priority = 0  # fill-in-the-middle is autocomplete: latency-critical
    streams = [pipeline.complete(_nth(req, i), ctx) for i in range(req.n)]
    ids = openai.ChatIds("cmpl")
    if not req.stream:
        choices = [aggregate(c) for c in await asyncio.gather(*(collect(s) for s in streams))]
        if req.echo:
            for c in choices:
                c.text = req.prompt + c.text
        return json_response(openai.completion_object(ids, req.model, choices, stream=False),
                             headers=velo_headers(ctx))
    return await _sse(request, streams, lambda i, c: openai.completion_chunk(ids, req.model, i, c),
                      openai.stream_options_usage(body), ids, req.model, "text_completion", opening=False)


def _nth(req: Any, i: int) -> Any:
    """The i-th of n choices: a seeded request gets distinct but reproducible seeds per choice."""
    if i == 0 or req.options.seed is None:
        return req
    return replace(req, options=replace(req.options, seed=req.options.seed + i))


async def _sse(request: web.Request, streams: list[AsyncIterator[Chunk]], shape: Callable[[int, Chunk], dict],
               include_usage: bool, ids: openai.ChatIds, model_name: str, obj: str,
               opening: bool) -> web.StreamResponse:
    usages: list = []

    async def events() -> AsyncIterator[tuple[int, Chunk]]:
        async for index, chunk in _merge(streams):
            if chunk.usage is not None:
                usages.append(chunk.usage)
            yield index, chunk

    async def finish() -> bytes:
        return sse(openai.usage_chunk(ids, model_name, obj, usages)) if include_usage else b""

    opened: set[int] = set()

    def encode(item: tuple[int, Chunk]) -> bytes:
        index, chunk = item
        head = b""
        if opening and index not in opened:  # OpenAI opens each choice with a role delta
            opened.add(index)
            head = sse(openai.chat_chunk(ids, model_name, index, None, first=True))
        return head + sse(shape(index, chunk))

    return await write_stream(request, request[CONTEXT], events(), encode,
                              lambda e: sse(openai.error_object(e)), "text/event-stream", SSE_DONE, finish)


async def _merge(streams: list[AsyncIterator[Chunk]]) -> AsyncIterator[tuple[int, Chunk]]:
    """Interleaves n choice streams as chunks arrive; closing the merge closes every stream."""
    if len(streams) == 1:
        try:
            async for chunk in streams[0]:
                yield 0, chunk
        finally:
            await streams[0].aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[Chunk]) -> None:
        try:
            async for chunk in s:
                await queue.put((i, chunk, None))
        except Exception as e:  # noqa: BLE001 - re-raised in the consumer
            await queue.put((i, None, e))
        finally:
            await queue.put((i, None, StopAsyncIteration()))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(streams)
        while live:
            i, chunk, err = await queue.get()
            if isinstance(err, StopAsyncIteration):
                live -= 1
            elif err is not None:
                raise err
            else:
                yield i, chunk
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            await s.aclose()  # type: ignore[attr-defined]


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v1/models", models)
    r.add_get("/v1/models/{name:.+}", model)
    r.add_post("/v1/chat/completions", chat_completions)
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/embeddings", embeddings)


async def embeddings(request: web.Request) -> web.Response:
    req, encoding = openai.parse_embeddings(await read_json(request))
    result = await request.app[PIPELINE].embed(req, request[CONTEXT])
    return json_response(openai.embeddings_object(req.model, result, encoding))
