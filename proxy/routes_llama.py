"""llama-server's own routes, passed on to a llama-server backend as they are, so a client pointed at Velo where it
pointed at llama-server keeps working: llama.vscode's autocomplete posts `/infill` with repository context
(`input_extra`) and llama-server's samplers, which no dialect carries; SillyTavern counts tokens with `/tokenize`
(without it, it guesses a tokenizer from the model's name) and reads `/props` and `/slots`; Dify's rerank models
post `/v1/rerank` (a llama-server started with `--reranking`). Errors come in OpenAI's shape, which is
llama-server's."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
from aiohttp import web

from adapters.errors import NotFound
from adapters.fields import body_object
from adapters.base import Backend

from .auth import CALLER
from .dialects import LLAMA_SERVER_PATHS, openai
from .http_io import read_json, sse, write_stream
from .state import PIPELINE, ROUTER
from .token_count import CHARS_PER_TOKEN


_GET = ("/props", "/slots")


async def native(request: web.Request) -> web.StreamResponse:
    """Under the key's limits like every generation (/completion, /infill and /rerank went around them); the GETs
    (/props, /slots) read state only."""
    body = await _body(request)
    server, model = await _llama_server(request, request.query.get("model") if body is None else body.get("model"))
    path = request.path_qs
    if model is not None:  # the server's name for it: an alias or a preset's went on, unknown to a router's
        if body is None:
            path = str(request.rel_url.update_query(model=model))
        else:
            body = {**body, "model": model}
    stream = bool(body and body.get("stream"))
    if body is None:
        return await _passed_on(request, server, path, body, stream, _as_is, {})
    # its size, read already (a chunked body has no Content-Length), as its tokens' estimate until the answer counts
    prompt = len(await request.read()) // CHARS_PER_TOKEN
    with request[PIPELINE].limit.held(request[CALLER].tenant, "openai", prompt) as charge:
        used = Used(stream) if request.path in _GENERATIONS else None  # only these answers say what they used
        try:
            return await _passed_on(request, server, path, body, stream, used.read if used else _as_is,
                                    charge.headers)
        finally:
            charge.tokens = (used.total() if used else 0) or charge.tokens


async def _passed_on(request: web.Request, server: Backend, path: str, body: dict[str, Any] | None, stream: bool,
                     read: Callable[[bytes], bytes], headers: dict[str, str]) -> web.StreamResponse:
    """The answer with the key's state in OpenAI's headers (llama-server's errors are OpenAI's shape)."""
    return await write_stream(request, server.native(request.method, path, body), read,
                              lambda e: sse(openai.error_object(e)) if stream else None,
                              "text/event-stream" if stream else "application/json", headers=lambda: headers)


def _as_is(piece: bytes) -> bytes:
    return piece


_GENERATIONS = ("/completion", "/infill")
# Of a whole answer, or a stream's event, at most this much is kept to read its counts from, on the event loop: a
# /completion's whole answer is ~50 KB for 4,000 tokens; one larger (every token's alternatives, `n_probs`) is
# charged its estimate
_WHOLE_MAX = 1024 * 1024


@dataclass
class Used:
    """The tokens an answer of /completion or /infill says it used: llama-server writes `tokens_evaluated` (the
    prompt) and `tokens_predicted` into each result of its whole answer (an array of them for an array of prompts)
    and into each result's last stream event (their `index` tells them apart). The output went uncharged (a key's
    tokens per minute held only the body's size)."""

    stream: bool
    results: dict[int, int] = field(default_factory=dict)  # a result's index -> its tokens, prompt and output
    held: list[bytes] = field(default_factory=list)  # an event's start; or, not streamed, the answer so far (in
    # pieces: joined at every read, a large one cost the square of its size)
    size: int = 0  # of what `held` holds, or would hold past _WHOLE_MAX

    def read(self, piece: bytes) -> bytes:
        if not self.stream or piece.find(b"\n") < 0:  # `find`: Python 3.11's `bytes in` raises a TypeError first
            self._hold(piece)
            return piece
        first, *events, rest = piece.split(b"\n")
        held = [b"".join([*self.held, first])] if self.size + len(first) <= _WHOLE_MAX else []  # else passed over
        for event in (*held, *events):
            if event.find(b'"tokens_predicted"') >= 0:  # a result's last event: the others are not parsed
                self._count(event.partition(b":")[2])  # after "data:"
        self.held, self.size = [rest], len(rest)
        return piece

    def _hold(self, piece: bytes) -> None:
        """Kept until its event (or the whole answer) is complete, up to _WHOLE_MAX: one longer is let go."""
        self.size += len(piece)
        if self.size <= _WHOLE_MAX:
            self.held.append(piece)
        else:
            self.held.clear()

    def total(self) -> int:
        """The tokens of every result, 0 when the answer said none."""
        if not self.stream:
            self._count(b"".join(self.held))
            self.held = []
        return sum(self.results.values())

    def _count(self, payload: bytes) -> None:
        try:
            answer = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        for result in answer if isinstance(answer, list) else [answer]:
            if isinstance(result, dict) and isinstance(predicted := result.get("tokens_predicted"), int):
                evaluated, index = result.get("tokens_evaluated"), result.get("index")
                self.results[index if isinstance(index, int) else 0] = predicted + (
                    evaluated if isinstance(evaluated, int) else 0)


async def _body(request: web.Request) -> dict[str, Any] | None:
    """A GET (or HEAD, aiohttp's with every GET: a 400 asking for a body) has none, nor has a slot's erase
    (`POST /slots/0?action=erase`); every other route takes an object."""
    if request.method in ("GET", "HEAD") or ("id_slot" in request.match_info and not request.can_read_body):
        return None
    return body_object(await read_json(request))


async def _llama_server(request: web.Request, model: Any) -> tuple[Backend, str | None]:
    """The backend `model` names, with the model's name there; else the one llama-server (or set of them) among the
    backends."""
    router = request[ROUTER]
    target = await router.resolve(model) if isinstance(model, str) and model else None
    backends = [target.backend] if target is not None else list(router.backends.values())
    servers = [b for b in backends if b.config.kind == "llamacpp"]
    if len(servers) != 1:
        why = "config.toml has none, or several (name one's model with `model`)" if target is None else \
            f'model {model!r} is served by backend {target.backend.name!r} (kind = "{target.backend.config.kind}")'
        raise NotFound(f"{request.path} is llama-server's own route, passed to a llama-server backend: {why}")
    return servers[0], target.model if target is not None else None


def add_routes(app: web.Application) -> None:
    for path in LLAMA_SERVER_PATHS:
        (app.router.add_get if path in _GET else app.router.add_post)(path, native)
    app.router.add_post("/slots/{id_slot}", native)  # ?action=save|restore|erase
