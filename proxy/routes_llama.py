"""llama-server's own generation routes (`/infill`, `/completion`), passed on to a llama-server backend as they are:
llama.vscode's autocomplete posts `/infill` with repository context (`input_extra`) and llama-server's samplers,
which no dialect carries, so an editor pointed at Velo where it pointed at llama-server keeps working. Errors come
in OpenAI's shape, which is llama-server's."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from adapters.errors import NotFound
from adapters.fields import body_object
from adapters.llamacpp import LlamaCppBackend

from .dialects import LLAMA_SERVER_PATHS, openai
from .http_io import read_json, sse, write_stream
from .state import ROUTER


async def native(request: web.Request) -> web.StreamResponse:
    body = body_object(await read_json(request))
    server = await _llama_server(request, body.get("model"))
    stream = bool(body.get("stream"))
    return await write_stream(request, server.native(request.path, body), lambda piece: piece,
                              lambda e: sse(openai.error_object(e)) if stream else b"",
                              "text/event-stream" if stream else "application/json")


async def _llama_server(request: web.Request, model: Any) -> LlamaCppBackend:
    """The backend `model` names, else the one llama-server among the backends."""
    router = request[ROUTER]
    named = isinstance(model, str) and model
    backends = [(await router.resolve(model)).backend] if named else list(router.backends.values())
    servers = [b for b in backends if isinstance(b, LlamaCppBackend)]
    if len(servers) != 1:
        why = (f"model {model!r} is served by none" if named else
               "config.toml has none, or several (name one's model with `model`)")
        raise NotFound(f"{request.path} is llama-server's own route, passed to a llama-server backend: {why}")
    return servers[0]


def add_routes(app: web.Application) -> None:
    for path in LLAMA_SERVER_PATHS:
        app.router.add_post(path, native)
