"""/api/create, /api/copy and /api/delete as Ollama answers them, on model presets (proxy/presets.py) for every
backend.

A create from a model (`from` + `system` / `parameters` / `template` / `messages`) is always a Velo preset, on an
Ollama backend too: one behaviour for every backend and dialect, with Velo's defaults and `[models]` settings applied
the same way, and a preset that outlives a change of backend. What only Ollama can build (a model from `files`,
`adapters`, `quantize`) goes to an Ollama backend when there is one; models an Ollama backend holds are
copied and deleted there.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from aiohttp import web

from adapters.errors import BadRequest, ModelNotFound
from adapters.fields import body_object, get
from adapters.protocol import ModelInfo

from .dialects.ollama import now_iso, parse_message, parse_options
from .dialects.ollama_names import go_quoted
from .http_io import json_response, ndjson, read_json
from .presets import Preset, full_name, spellings
from .router import Router
from .routes_ollama import manage
from .state import ROUTER

# Ollama's model names (types/model/name.go isValidPart): [[host/]namespace/]model[:tag], each part ASCII letters,
# digits, "_", "-" and "." (no "." in a namespace, a ":port" in a host), first a letter, digit or "_"; a host up to
# 350 characters, the others up to 80. `\w` let any letter in, and the model part ran to any length (a 2,000-character
# name was listed, and no request could use it).
_PART = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"
_VALID_NAME = re.compile(rf"(?:(?:[A-Za-z0-9_][A-Za-z0-9_.:-]{{0,349}}/)?[A-Za-z0-9_][A-Za-z0-9_-]{{0,79}}/)?"
                         rf"{_PART}(?::{_PART})?")
_OLLAMA_ONLY = ("files", "adapters", "quantize", "draft_files", "remote_host")
# Ollama's last status lines of a create from a model whose layers all exist already.
_CREATED = ({"status": "writing manifest"}, {"status": "success"})


async def create(request: web.Request) -> web.StreamResponse:
    body = body_object(await read_json(request))
    name = _valid(_name(body, "model", "name"))
    if any(body.get(k) for k in _OLLAMA_ONLY):
        return await _on_ollama(request, "a model from files, adapters or quantize")
    base = get(body, "from", str)
    if not base:
        raise BadRequest("neither 'from' or 'files' was specified", param="from")
    parameters, messages = get(body, "parameters", dict, {}), get(body, "messages", list, [])
    parse_options({"options": parameters})  # a bad parameter is a 400 naming it now, not at each request
    for message in messages:
        parse_message(message)  # a bad message too
    preset = Preset(full_name(name), base, get(body, "system", str), get(body, "template", str), parameters,
                    messages=messages)
    router = request[ROUTER]
    if (older := router.presets.get(base)) is not None:
        preset = preset.over(older)
    elif await _listed(router, base) is None:
        raise ModelNotFound(base)
    await router.presets.put(preset)
    if body.get("stream", True) is False:
        return json_response(_CREATED[-1])
    return web.Response(body=b"".join(ndjson(s) for s in _CREATED), content_type="application/x-ndjson")


async def copy(request: web.Request) -> web.StreamResponse:
    body = body_object(await read_json(request))
    source, destination = _name(body, "source"), _name(body, "destination")
    if not _VALID_NAME.fullmatch(destination):  # CopyHandler's words
        raise BadRequest(f"destination {go_quoted(destination)} is invalid", param="destination")
    destination = full_name(destination)
    router = request[ROUTER]
    if (preset := router.presets.get(source)) is not None:
        await router.presets.put(replace(preset, name=destination, modified_at=now_iso()))
        return web.Response()
    info = await _listed(router, source)
    if info is None and not _VALID_NAME.fullmatch(source):  # Ollama's CopyHandler: a 400 before any lookup
        raise BadRequest(f'source "{source}" is invalid', param="source")
    if info is None:
        raise ModelNotFound(source, f"model {go_quoted(source)} not found")  # CopyHandler's %q, not '%s'
    if _on_an_ollama_backend(router, info):
        return await manage(request)
    await router.presets.put(Preset(destination, source))  # a backend's model under a new name: a bare preset
    return web.Response()


async def delete(request: web.Request) -> web.StreamResponse:
    body = body_object(await read_json(request))
    name = _name(body, "model", "name")
    router = request[ROUTER]
    if await router.presets.delete(name):  # any name a preset has, one an earlier Velo let through included
        return web.Response()
    if not _VALID_NAME.fullmatch(name):  # DeleteHandler's words
        raise BadRequest(f"name {go_quoted(name)} is invalid", param="model")
    info = await _listed(router, name)
    if info is None:
        raise ModelNotFound(name)
    if _on_an_ollama_backend(router, info):
        _refuse_a_presets_base(router, info.name)
        return await manage(request)
    raise BadRequest(f"model '{name}' comes from backend '{info.backend}', which Velo does not delete models from; "
                     "only presets (made with /api/create or /api/copy) can be deleted", param="model")


def _refuse_a_presets_base(router: Router, name: str) -> None:
    """A preset keeps only its base's name, where Ollama's created model keeps its own copy of the layers: deleting
    the base left the preset listed, and each chat with it a 404 naming a model the client never asked for."""
    over = sorted(p.name for p in router.presets.all() if p.base in spellings(name))
    if over:
        raise BadRequest(f"model '{name}' is the base of {', '.join(over)}: delete {'them' if len(over) > 1 else 'it'}"
                         " first", param="model")


def _name(body: dict[str, Any], *keys: str) -> str:
    """The first of `keys` the body sets (Ollama's older clients send `name`), or Ollama's 400."""
    value = next((body[k] for k in keys if body.get(k)), None)
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{keys[0]} is required: a model name", param=keys[0])
    return value


def _valid(name: str) -> str:
    if not _VALID_NAME.fullmatch(name):
        raise BadRequest(f'invalid model name "{name}": letters, digits, "_", "-" and "." with an optional ":tag"',
                         param="model")
    return name


async def _listed(router: Router, name: str) -> ModelInfo | None:
    models = {m.name: m for m in await router.list_models()}
    return models.get(name) or models.get(full_name(name))


def _on_an_ollama_backend(router: Router, info: ModelInfo) -> bool:
    backend = router.backends.get(info.backend)
    return backend is not None and backend.config.kind == "ollama"


async def _on_ollama(request: web.Request, what: str) -> web.StreamResponse:
    if not any(b.config.kind == "ollama" for b in request[ROUTER].backends.values()):
        raise BadRequest(f"creating {what} needs an Ollama backend, and none is configured; Velo's own presets take "
                         "`from` with `system`, `parameters` and `template`")
    return await manage(request)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/create", create)
    app.router.add_post("/api/copy", copy)
    app.router.add_delete("/api/delete", delete)
