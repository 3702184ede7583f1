"""The parts of Ollama's API that are about ollama.com and its files, answered as a server without them answers.

The ollama CLI calls them: `ollama signin` / `signout` (/api/me, /api/signout), `ollama launch` (/api/status, whose
`cloud.disabled` hides cloud models from its picker, and /api/experimental/model-recommendations, whose default list
is cloud models Velo cannot serve), and `ollama create` from a GGUF file (each file sent to /api/blobs first). A
"no route" 404 printed as the CLI's error left the user guessing.
"""
from __future__ import annotations

from aiohttp import web

from adapters.errors import Unsupported

from .http_io import json_response

_NO_ACCOUNT = ("Velo has no ollama.com account to sign in or out of; sign in on the Ollama server itself "
               "(`OLLAMA_HOST=<its address> ollama signin`)")


async def status(request: web.Request) -> web.Response:
    return json_response({"cloud": {"disabled": True, "source": "velo"}})


async def recommendations(request: web.Request) -> web.Response:
    return json_response({"recommendations": []})


async def account(request: web.Request) -> web.Response:
    raise Unsupported(_NO_ACCOUNT)


async def blob(request: web.Request) -> web.Response:
    """Velo keeps no model files: a model made from a file is created on the Ollama server itself."""
    raise Unsupported("Velo keeps no model files: create a model from a GGUF file or an adapter on the Ollama server "
                      "itself (`OLLAMA_HOST=<its address> ollama create ...`); Velo's own presets take `from` with "
                      "`system`, `parameters` and `template`")


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/status", status)
    r.add_get("/api/experimental/model-recommendations", recommendations)
    r.add_post("/api/me", account)
    r.add_post("/api/signout", account)
    r.add_delete("/api/user/keys/{key}", account)
    r.add_post("/api/blobs/{digest}", blob)
    r.add_head("/api/blobs/{digest}", blob)
