"""The parts of Ollama's API that are about ollama.com and its files, answered as a server without them answers.

The ollama CLI calls them: `ollama signin` / `signout` (/api/me, /api/signout) and `ollama launch` (/api/status, whose
`cloud.disabled` hides cloud models from its picker, and /api/experimental/model-recommendations, whose default list
is cloud models Velo cannot serve). A "no route" 404 printed as the CLI's error left the user guessing.
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


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/status", status)
    r.add_get("/api/experimental/model-recommendations", recommendations)
    r.add_post("/api/me", account)
    r.add_post("/api/signout", account)
    r.add_delete("/api/user/keys/{key}", account)
