"""Ollama native API handlers: parse -> pipeline -> write, nothing more."""
from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Iterator

from aiohttp import web

from adapters import keep_alive
from adapters.base import Backend
from adapters.errors import BadRequest, ModelLacks, ModelNotFound, Unsupported, VeloError
from adapters.fields import body_object, get
from adapters.protocol import Chunk, ModelInfo, RunningModel, aggregate, epoch

from .auth import CALLER
from .dialects import ollama, ollama_models, ollama_names
from .http_io import job_for, json_response, ndjson, parse_body, read_json, write_stream
from .job import Job
from .presets import parameters_over
from .stages.fit import refuse_lacking
from .state import PIPELINE, ROUTER
from .stream_ends import as_streamed
from .streams import collect

OLLAMA_VERSION = "0.14.0"  # the Ollama API level Velo speaks (/v1/messages: 0.14.0); clients gate features on it


async def root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


async def version(request: web.Request) -> web.Response:
    return json_response({"version": OLLAMA_VERSION})


async def tags(request: web.Request) -> web.Response:
    """Newest first, as Ollama lists them (server/model_list_cache.go): a model just created comes first."""
    models = sorted(await request[ROUTER].list_models(), key=lambda m: epoch(m.modified_at), reverse=True)
    return json_response({"models": [ollama_models.tag_object(m) for m in models]})


async def show(request: web.Request) -> web.Response:
    body = body_object(await read_json(request))
    name = body.get("model") or body.get("name")  # older clients send "name"
    if not isinstance(name, str) or not name:
        raise BadRequest("model is required", param="model")
    router = request[ROUTER]
    with _named_in_ollamas_grammar(name):
        try:
            target = await router.resolve(name)
            info = await target.backend.show(target.model, body.get("verbose") is True)
        except ModelNotFound as e:  # named as ShowHandler names it: `nope` is `model 'nope:latest' not found`
            raise ModelNotFound(ollama_names.display_shortest(name)) from e
    info = replace(info, name=name)  # a copy: a backend may hand out its own card (the engine's, once unloaded)
    preset = router.presets.get(name)
    model = preset.shown(info) if preset else info
    # `parameters` are the model's own (Ollama's ShowHandler lists them before it applies the request's options):
    # `ollama run`'s /show parameters prints them as "Model defined", the session's /set ones after them
    shown = ollama_models.show_object(_as_asked(model, body), model.parameters)
    # a preset's conversation, which `ollama run` prints before its prompt
    return json_response({**shown, "messages": preset.messages} if preset and preset.messages else shown)


def _as_asked(info: ModelInfo, body: dict[str, Any]) -> ModelInfo:
    """With the request's own `system` and `options` over the model's, as Ollama shows them in its Modelfile:
    `ollama run` sends the session's `/set system` and `/set parameter` with its `/show modelfile`."""
    system, options = get(body, "system", str), get(body, "options", dict)
    return replace(info, system=system or info.system,
                   parameters=parameters_over(info.parameters, options) if options else info.parameters)


async def ps(request: web.Request) -> web.Response:
    router, residency = request[ROUTER], request[PIPELINE].residency
    backends = list(router.backends.values())
    running = []
    answers = await asyncio.gather(*(_safe_running(b, router.listing_timeout) for b in backends))
    for backend, models in zip(backends, answers):
        for model in models:
            if backend.idle_unload:  # Velo unloads it: when, it knows (an Ollama backend says for itself)
                model.expires_at = residency.expires_at(backend.name, model.name) or model.expires_at
            running.append(model)
    running.sort(key=lambda m: epoch(m.expires_at), reverse=True)  # the longest left first, as PsHandler sorts them
    return json_response({"models": [ollama_models.ps_object(m) for m in running]})


async def _safe_running(backend: Backend, wait: float) -> list[RunningModel]:
    """A backend that fails or is slower to say than the router waits for a listing shows nothing running: one that
    hung held /api/ps, backend after backend, for its total_timeout (1,800 s)."""
    try:
        return await asyncio.wait_for(backend.running(), wait)
    except (VeloError, asyncio.TimeoutError):
        return []


async def _load_or_unload(request: web.Request, model: str, keep: Any, think: Any = None,
                          generates: str | None = None, inserts: bool = False) -> tuple[str, int]:
    """Ollama's bare request (no messages, no prompt): loads the model, or with `keep_alive: 0` unloads it. Asking
    a model that cannot think to think is Ollama's 400 already here: `ollama run --think` sends it with its load
    request "so we fail before getting to the chat prompt" (cmd/cmd.go); so is a suffix (`inserts`) for a model
    that cannot fill in the middle, as GenerateHandler checks its capabilities before it loads."""
    router, residency = request[ROUTER], request[PIPELINE].residency
    target = await router.resolve(model)
    if keep_alive.unloads(keep):
        await residency.unload(target)
        return "unload", 0
    completes = bool(generates) and target.backend.knows_capabilities
    thinks = think not in (None, False)
    if (completes or thinks) and (info := await router.model_info(target)) is not None:  # an embed load asks nothing
        if completes:
            refuse_lacking(model, info, generates == "chat", inserts)  # an embedding model's chat "load": a 400
        if thinks and "thinking" not in info.capabilities:
            raise ModelLacks(model, "thinking")
    return "load", await residency.load(target, keep)


@contextlib.contextmanager
def _named_in_ollamas_grammar(model: str) -> Iterator[None]:
    """A name outside Ollama's grammar is its 400 "invalid model name" (or one with both source suffixes, its 400
    saying so), before any look-up (server/routes.go: the chat, generate, show and both embedding handlers). Velo
    serves any name it routes (a llama-server's file path, an alias), so only a name it serves no model by gets
    that 400, in place of its 404."""
    try:
        yield
    except ModelNotFound:
        if (why := ollama_names.refusal(model)) is None:
            raise
        raise BadRequest(why, param="model") from None


@contextlib.contextmanager
def _missing_as_embedding_handlers_say(model: str) -> Iterator[None]:
    """EmbedHandler and EmbeddingsHandler answer a model they cannot find through handleScheduleError."""
    try:
        yield
    except ModelNotFound as e:
        raise ollama.not_pulled(model) from e


async def chat(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req, started = await parse_body(request, ollama.parse_chat, body), time.perf_counter_ns()
    calls_sent = 0

    def shape(chunk: Chunk) -> dict:
        nonlocal calls_sent
        line = ollama.chat_object(req.model, chunk, started, calls_sent)
        calls_sent += len(chunk.tool_calls)
        return line
    with _named_in_ollamas_grammar(req.model):
        if not req.messages:  # Ollama loads (or unloads) the model and answers done at once
            reason, load_ns = await _load_or_unload(request, req.model, req.keep_alive, req.think, "chat")
            return json_response(ollama.chat_load_object(req.model, reason, load_ns))
        return await _answer(request, job_for(request, req, body), shape)


async def generate(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req, started = await parse_body(request, ollama.parse_generate, body), time.perf_counter_ns()
    with _named_in_ollamas_grammar(req.model):
        if not req.prompt:  # a suffix or images beside it too (GenerateHandler: `req.Prompt == ""`)
            reason, load_ns = await _load_or_unload(request, req.model, req.keep_alive, req.think, "generate",
                                                    req.suffix is not None)
            return json_response(ollama.load_object(req.model, reason, load_ns))
        return await _answer(request, job_for(request, req, body),
                             lambda c: ollama.generate_object(req.model, c, started))


async def _answer(request: web.Request, job: Job, shape: Callable[[Chunk], dict]) -> web.StreamResponse:
    stream = request[PIPELINE].generate(job)
    if job.request.stream:
        return await write_stream(request, as_streamed(stream), lambda c: ndjson(shape(c)),
                                  lambda e: ndjson(ollama.error_object(e)), "application/x-ndjson",
                                  job.outcome.headers, heartbeat=Chunk(heartbeat=True),
                                  ends=lambda c: c.finish_reason is not None)
    whole = aggregate(await collect(stream))
    whole.finish_reason = whole.finish_reason or "stop"
    return json_response(shape(whole), headers=job.outcome.headers())


async def embed(request: web.Request) -> web.Response:
    req, started = await parse_body(request, ollama.parse_embed, await read_json(request)), time.perf_counter_ns()
    with _named_in_ollamas_grammar(req.model), _missing_as_embedding_handlers_say(req.model):
        if not req.inputs:  # Ollama loads the model (or with keep_alive 0 unloads it) and answers with no figures
            await _load_or_unload(request, req.model, req.keep_alive)  # (EmbedHandler)
            return json_response({"model": req.model, "embeddings": []})
        result, _ = await request[PIPELINE].embed(req, request[CALLER])  # Ollama's API has no limit headers
    return json_response(ollama.embed_object(req.model, result, started))


async def embeddings(request: web.Request) -> web.Response:
    req = await parse_body(request, ollama.parse_legacy_embeddings, await read_json(request))
    with _named_in_ollamas_grammar(req.model), _missing_as_embedding_handlers_say(req.model):
        if not req.inputs[0]:  # Ollama loads the model (or with keep_alive 0 unloads it) and answers an empty vector
            await _load_or_unload(request, req.model, req.keep_alive)  # (EmbeddingsHandler)
            return json_response({"embedding": []})
        result, _ = await request[PIPELINE].embed(req, request[CALLER])  # Ollama's API has no limit headers
    return json_response({"embedding": result.embeddings[0] if result.embeddings else []})


async def manage(request: web.Request) -> web.StreamResponse:
    """/api/pull, /api/push, /api/create, /api/copy, /api/delete: passed through to an Ollama backend."""
    body = body_object(await read_json(request))
    backend = await _ollama_backend_for(request, body.get("model") or body.get("name") or body.get("source"))
    path = request.path
    stream = backend.manage(request.method, path, body)
    if path in ("/api/copy", "/api/delete"):
        await collect(stream)
        return web.Response(status=200)
    if body.get("stream", True) is False:
        statuses = await collect(stream)
        return json_response(statuses[-1] if statuses else {"status": "success"})
    return await write_stream(request, stream, ndjson, lambda e: ndjson(ollama.error_object(e)),
                              "application/x-ndjson")


# manifest.BlobsPath: only a sha256 digest names a blob (and the URL path Velo sends on stays one segment)
_DIGEST = re.compile(r"sha256[:-][0-9a-fA-F]{64}")


async def blob(request: web.Request) -> web.Response:
    """HEAD and POST /api/blobs/{digest}, which `ollama create` sends for each file (a GGUF, an adapter) before its
    create: passed through to the Ollama backend that /api/create's `files` then go to, the upload as it arrives
    (never held by Velo, so no body limit but the backend's `total_timeout`)."""
    digest = request.match_info["digest"]
    if not _DIGEST.fullmatch(digest):
        raise BadRequest("invalid digest format")
    try:
        backend = await _ollama_backend_for(request, None)
    except Unsupported:
        raise Unsupported("Velo keeps no model files, and no Ollama backend is configured to pass them to: create a "
                          "model from a GGUF file or an adapter on the Ollama server itself (`OLLAMA_HOST=<its "
                          "address> ollama create ...`); Velo's own presets take `from` with `system`, `parameters` "
                          "and `template`") from None
    status = await backend.blob(request.method, digest, request.content if request.method == "POST" else None)
    return web.Response(status=status)


async def pull_or_push(request: web.Request) -> web.StreamResponse:
    """/api/pull and /api/push go to an Ollama backend, unless Velo serves the model otherwise (a preset, another
    backend's): such a model, as any Velo serves where no Ollama is configured, is "pulled" at once (Codex's --oss
    pulls any model it does not see listed); anything else is a 400 saying where models come from."""
    body = body_object(await read_json(request))
    model = body.get("model") or body.get("name")
    router, verb = request[ROUTER], request.path.rsplit("/", 1)[-1]
    # any name Ollama finds it by (Open Interpreter pulls `name:latest` of a model listed without a tag), as the
    # router serves it: a model served as `Tiny` was refused its pull
    named = isinstance(model, str) and model
    listed = next((m for m in await router.list_models() if ollama_names.same_model(m.name, model)),
                  None) if named else None
    velos = named and router.presets.get(model) is not None or listed is not None and (
        listed.backend not in router.backends or router.backends[listed.backend].config.kind != "ollama")
    if any(b.config.kind == "ollama" for b in router.backends.values()) and (verb == "push" or not velos):
        return await manage(request)  # a preset, or another backend's model, is Velo's: Ollama's registry has others
    if verb == "pull" and (velos or listed is not None):
        done = {"status": "success"}
        if body.get("stream", True) is False:
            return json_response(done)
        return await write_stream(request, _one(done), ndjson, lambda e: ndjson(ollama.error_object(e)),
                                  "application/x-ndjson")
    does = {"pull": "pulls", "push": "pushes"}[verb]
    raise BadRequest(f"cannot {verb} {model!r}: Velo {does} models only through an Ollama backend, and none is "
                     "configured; it serves the models of the backends in config.toml (engine, llama.cpp, "
                     "OpenAI-compatible): add a model there", param="model")


async def _one(status: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield status


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
    r.add_post("/api/pull", pull_or_push)
    r.add_post("/api/push", pull_or_push)  # /api/create, /api/copy, /api/delete: routes_presets.py
    r.add_post("/api/blobs/{digest}", blob)
    r.add_head("/api/blobs/{digest}", blob)
