"""Ollama native API handlers: parse -> pipeline -> write, nothing more."""
from __future__ import annotations

import time
from typing import Any, Callable

from aiohttp import web

from adapters.base import Backend
from adapters.errors import BadRequest, ModelNotFound, Unsupported, VeloError
from adapters.protocol import Chunk, aggregate

from .auth import CALLER
from .dialects import ollama
from .http_io import job_for, json_response, ndjson, read_json, write_stream
from .job import Job
from .state import PIPELINE, ROUTER
from .stream_ends import separate_finish
from .streams import collect

OLLAMA_VERSION = "0.14.0"  # the Ollama API level Velo speaks (/v1/messages: 0.14.0); clients gate features on it


async def root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


async def version(request: web.Request) -> web.Response:
    return json_response({"version": OLLAMA_VERSION})


async def tags(request: web.Request) -> web.Response:
    models = await request[ROUTER].list_models()
    return json_response({"models": [ollama.tag_object(m) for m in models]})


async def show(request: web.Request) -> web.Response:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    name = body.get("model") or body.get("name")  # older clients send "name"
    if not isinstance(name, str) or not name:
        raise BadRequest("model is required", param="model")
    target = await request[ROUTER].resolve(name)
    info = await target.backend.show(target.model)
    info.name = name
    return json_response(ollama.show_object(info))


async def ps(request: web.Request) -> web.Response:
    router = request[ROUTER]
    running = [m for b in router.backends.values() for m in await _safe_running(b)]
    return json_response({"models": [ollama.ps_object(m) for m in running]})


async def _safe_running(backend: Backend) -> list:
    try:
        return await backend.running()
    except VeloError:
        return []


async def chat(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req, started = ollama.parse_chat(body), time.perf_counter_ns()
    if not req.messages:  # Ollama loads the model and answers done at once
        await request[ROUTER].resolve(req.model)
        return json_response({"model": req.model, "created_at": ollama.now_iso(),
                              "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "load"})
    return await _answer(request, job_for(request, req, body), lambda c: ollama.chat_object(req.model, c, started))


async def generate(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req, started = ollama.parse_generate(body), time.perf_counter_ns()
    if not req.prompt and not req.suffix and not req.images:
        await request[ROUTER].resolve(req.model)
        return json_response(ollama.load_object(req.model, unload=req.keep_alive in (0, "0", "0s")))
    return await _answer(request, job_for(request, req, body),
                         lambda c: ollama.generate_object(req.model, c, started))


async def _answer(request: web.Request, job: Job, shape: Callable[[Chunk], dict]) -> web.StreamResponse:
    stream = request[PIPELINE].generate(job)
    if job.request.stream:
        return await write_stream(request, separate_finish(stream), lambda c: ndjson(shape(c)),
                                  lambda e: ndjson(ollama.error_object(e.message)), "application/x-ndjson",
                                  job.outcome.headers)
    whole = aggregate(await collect(stream))
    whole.finish_reason = whole.finish_reason or "stop"
    return json_response(shape(whole), headers=job.outcome.headers())


async def embed(request: web.Request) -> web.Response:
    req = ollama.parse_embed(await read_json(request))
    result = await request[PIPELINE].embed(req, request[CALLER])
    return json_response(ollama.embed_object(req.model, result))


async def embeddings(request: web.Request) -> web.Response:
    req = ollama.parse_legacy_embeddings(await read_json(request))
    result = await request[PIPELINE].embed(req, request[CALLER])
    return json_response({"embedding": result.embeddings[0] if result.embeddings else []})


async def manage(request: web.Request) -> web.StreamResponse:
    """/api/pull, /api/push, /api/create, /api/copy, /api/delete: passed through to an Ollama backend."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    backend = await _ollama_backend_for(request, body.get("model") or body.get("name") or body.get("source"))
    path = request.path
    stream = backend.manage(request.method, path, body)
    if path in ("/api/copy", "/api/delete"):
        await collect(stream)
        return web.Response(status=200)
    if body.get("stream", True) is False:
        statuses = await collect(stream)
        return json_response(statuses[-1] if statuses else {"status": "success"})
    return await write_stream(request, stream, ndjson, lambda e: ndjson(ollama.error_object(e.message)),
                              "application/x-ndjson")


async def _ollama_backend_for(request: web.Request, model: Any) -> Backend:
    router = request[ROUTER]
    if isinstance(model, str) and model:
        try:
            target = await router.resolve(model)
            if target.backend.config.kind == "ollama":
                return target.backend
        except ModelNotFound:
            pass
    for backend in router.backends.values():
        if backend.config.kind == "ollama":
            return backend
    raise Unsupported(f"{request.path} manages models on an Ollama backend, and none is configured")


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/", root)
    r.add_get("/api/version", version)
    r.add_get("/api/tags", tags)
    r.add_post("/api/show", show)
    r.add_get("/api/ps", ps)
    r.add_post("/api/chat", chat)
    r.add_post("/api/generate", generate)
    r.add_post("/api/embed", embed)
    r.add_post("/api/embeddings", embeddings)
    for path in ("/api/pull", "/api/push", "/api/create", "/api/copy"):
        r.add_post(path, manage)
    r.add_delete("/api/delete", manage)
