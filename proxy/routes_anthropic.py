"""Anthropic Messages API handlers (`/v1/messages`, also with `?beta=true`, and `/v1/messages/count_tokens`):
parse -> pipeline -> write. `x-api-key` authenticates like a Bearer token (proxy/auth.py); `anthropic-version` and
`anthropic-beta` are accepted and change nothing."""
from __future__ import annotations


from typing import Any

from aiohttp import web

from adapters.protocol import Chunk, aggregate

from . import context_edits
from .count_request import as_sent
from .dialects import anthropic, new_id
from .http_io import ignored_tools_header, job_for, json_response, parse_body, read_json, write_stream
from .state import PIPELINE, ROUTER
from .streams import collect
from .token_count import counter, estimate, prompt_tokens


async def messages(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    parsed = await parse_body(request, anthropic.parse_messages, body)
    req, job = parsed.request, job_for(request, parsed.request, body)
    job.context_edits = parsed.edits or ()
    stream = request[PIPELINE].generate(job)
    msg_id = new_id("msg")

    def context() -> dict[str, Any]:
        return anthropic.context_management_object(job.outcome.context_edits)
    asked = context if parsed.edits is not None else None

    def headers() -> dict[str, str]:
        return {**job.outcome.headers(), **ignored_tools_header(parsed.ignored_tools)}

    stops, guess = tuple(req.options.stop), estimate(req)
    if not req.stream:
        whole = aggregate(await collect(stream))
        return json_response(anthropic.message_object(msg_id, req.model, whole, req.options.max_tokens,
                                                      asked() if asked else None, stops, guess), headers=headers())
    writer = anthropic.MessageStream(msg_id, req.model, req.options.max_tokens, asked, input_tokens=guess,
                                     stops=stops)

    async def finish() -> bytes:
        return writer.finish()
    return await write_stream(request, stream, writer.encode, anthropic.error_event, "text/event-stream", headers,
                              finish=finish, heartbeat=Chunk(heartbeat=True), ends=lambda _: writer.done)


async def count_tokens(request: web.Request) -> web.Response:
    """The backend's own count where it has a tokenizer (engine, llama-server), else an estimate (token_count.py);
    `X-Velo-Token-Count` says which. With context editing, the count after it, and `original_input_tokens`."""
    parsed = await parse_body(request, anthropic.parse_messages, await read_json(request), count_only=True)
    target, info, req = await as_sent(request[ROUTER], parsed.request, "anthropic")
    tokens, exact = await prompt_tokens(target, info, req)
    out: dict[str, Any] = {"input_tokens": tokens}
    if parsed.edits is not None:
        edited = await context_edits.apply(req, parsed.edits, counter(target, info), tokens)
        out = {"input_tokens": tokens - sum(a.tokens for a in edited.applied),
               "context_management": {"original_input_tokens": tokens}}
    return json_response(out, headers={"X-Velo-Token-Count": "exact" if exact else "estimate"})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
