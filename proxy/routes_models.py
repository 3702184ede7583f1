"""GET /v1/models and /v1/models/{name}, which OpenAI's and Anthropic's APIs share: each client gets its own shape,
told apart by the `anthropic-version` header that Anthropic's clients always send (dialects.dialect_of)."""
from __future__ import annotations

from aiohttp import web

from adapters.errors import ModelNotFound

from .dialects import anthropic, dialect_of, openai
from .http_io import json_response
from .presets import by_spelling
from .state import ROUTER


async def models(request: web.Request) -> web.Response:
    listed = await request[ROUTER].list_models()
    if dialect_of(request.path, request.headers) == "anthropic":
        return json_response(anthropic.model_page(listed, request.query))
    return json_response({"object": "list", "data": [openai.model_object(m) for m in listed]})


async def model(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    shape = anthropic.model_object if dialect_of(request.path, request.headers) == "anthropic" \
        else openai.model_object
    info = by_spelling({m.name: m for m in await request[ROUTER].list_models()}, name)  # `m` is `m:latest`
    if info is not None:
        return json_response(shape(info))
    raise ModelNotFound(name, f"The model '{name}' does not exist")  # OpenAI's words, and its model_not_found


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models)
    app.router.add_get("/models", models)  # as llama-server answers it (dialects.UNVERSIONED)
    app.router.add_get("/v1/models/{name:.+}", model)
