"""OpenAI Responses API handlers: `POST /v1/responses` (streamed and not), `GET` / `DELETE /v1/responses/{id}`,
`GET /v1/responses/{id}/input_items`, `POST /v1/responses/{id}/cancel`, `POST /v1/responses/input_tokens`,
`POST /v1/responses/compact`. parse -> pipeline -> write; a stored response continues with `previous_response_id`,
and its items stand in for the `item_reference`s that name them (proxy/responses_store.py).

Compaction, as Codex asks for it when its context fills (`POST /v1/responses/compact`, or `POST /v1/responses` whose
input ends with a `compaction_trigger`): the model summarises the conversation, and the answer is one compaction
item that Codex sends back in place of the history. The summary's job drops the oldest turns that do not fit the
context: compaction is asked for exactly when the conversation has grown too long.

A streamed turn whose prompt does not fit fails inside its stream (`response.failed`, code
`context_length_exceeded`): that event is how Codex learns its context is full and compacts, where a 400 ends its
turn as an invalid request (codex-rs core/src/api_bridge.rs)."""
from __future__ import annotations

import asyncio
import time
from contextlib import aclosing, nullcontext
from dataclasses import replace
from typing import Any, AsyncIterator, Callable

from aiohttp import web

from adapters.errors import BadRequest, ContextOverflow, NotFound, Overloaded, VeloError
from adapters.fields import get
from adapters.protocol import ChatRequest, Chunk, aggregate

from .auth import CALLER
from .background import POLL_KEEP_S, Run, unpack_events
from .count_request import as_sent
from .dialects import new_id, responses
from .dialects.paging import query_int
from .dialects.responses_stream import ResponseStream
from .http_io import ignored_tools_header, job_for, json_response, parse_body, read_json, write_stream
from .inflight import RUNNING, Cancelled
from .job import Job, holding
from .live_responses import Live
from .responses_store import StoredResponse
from .stages.admit import Admit
from .stages.limit import Limit
from .state import BACKGROUND, GENERATION, LIVE, PIPELINE, RESPONSES, ROUTER
from .streams import collect
from .token_count import prompt_tokens


async def create(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    parsed = await _parsed(request, body)
    history = await _history(request, parsed)
    req, inputs = await parse_body(request, _with_inputs, parsed, history)
    job = job_for(request, req, body)
    resp_id = new_id("resp")

    def headers() -> dict[str, str]:
        return {**job.outcome.headers(), **ignored_tools_header(parsed.ignored_tools)}

    if parsed.echo.get("background"):
        # listed under the response's id, and streamed whatever the client asked: its events are written as they
        # come, so a poll finds it in progress with its output so far, and a cancel keeps that output (asked as one
        # answer, it stayed `queued` until its end and was cancelled with none)
        job = replace(job, caller=replace(job.caller, request_id=resp_id), request=replace(job.request, stream=True))
        return await _in_background(request, parsed, inputs, job, headers)
    stream = request[PIPELINE].generate(job)
    if not parsed.stream:
        return await _whole(request, parsed, inputs, stream, resp_id, headers)
    return await _streamed(request, parsed, inputs, stream, resp_id, headers)


def _with_inputs(parsed: responses.Parsed, history: list[dict[str, Any]]) -> tuple[ChatRequest, list[dict[str, Any]]]:
    """The backend's request, and the input items as they are stored: each reads every item, so both are made where
    the body is parsed (on a thread where it is large: http_io.parse_body)."""
    req = (parsed.summary if parsed.compact else parsed.chat)(history)
    return req, [responses.stored_item(i) for i in parsed.items]


async def _whole(request: web.Request, parsed: responses.Parsed, inputs: list[dict[str, Any]],
                 stream: AsyncIterator[Chunk], resp_id: str, headers: Callable[[], dict[str, str]]) -> web.Response:
    """The answer as one response object, stored before it is returned; `headers()` read once the pipeline has run."""
    created, whole = time.time(), aggregate(await collect(stream))
    output = [responses.compaction_item(whole.text)] if parsed.compact else \
        responses.output_items(whole, parsed.names)
    obj = responses.response_object(resp_id, parsed, created, responses.status_of(whole), output, whole.usage,
                                    finish=whole.finish_reason)
    await _keep(request, parsed, StoredResponse(obj, inputs, parsed.previous_response_id))
    return json_response(obj, headers=headers())


async def _streamed(request: web.Request, parsed: responses.Parsed, inputs: list[dict[str, Any]],
                    stream: AsyncIterator[Chunk], resp_id: str,
                    headers: Callable[[], dict[str, str]]) -> web.StreamResponse:
    """The answer as the Responses API's events, the response stored before its last ones go out; listed while it
    streams (proxy/live_responses.py), where a DELETE keeps it from being stored."""
    writer, stored = ResponseStream(resp_id, parsed, compacting=parsed.compact), False
    live = Live(writer, inputs, parsed.previous_response_id)
    tenant = request[CALLER].tenant

    async def kept(events: bytes) -> bytes:
        """The response's last events, once it is stored (once): a client that continued at once
        (`previous_response_id`) found no response, `response.completed` having gone out before the pipeline's work
        after the answer. A failed one too, as OpenAI keeps it (status and error): retrieving it was a 404."""
        nonlocal stored
        if not stored and writer.final is not None and not live.deleted:
            stored = True
            await _keep(request, parsed, live.record(ended=True))
            if live.deleted:  # while it was stored: that DELETE may have found it half there
                await request.app[RESPONSES].delete(tenant, resp_id)
        return events

    async def stored_first(chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk | bytes]:
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk if chunk.finish_reason is None else await kept(writer.encode(chunk))

    async def finish() -> bytes:
        return await kept(writer.finish())

    async def failed(err: VeloError) -> bytes:
        return await kept(writer.fail(err))
    with request.app[LIVE].listed(tenant, live) if parsed.store else nullcontext():
        return await write_stream(request, stored_first(stream), _encoded_or(writer.encode), failed,
                                  "text/event-stream", headers, finish=finish, streamed_errors=(ContextOverflow,),
                                  heartbeat=Chunk(heartbeat=True), ends=lambda _: writer.final is not None)


async def _in_background(request: web.Request, parsed: responses.Parsed, inputs: list[dict[str, Any]], job: Job,
                         headers: Callable[[], dict[str, str]]) -> web.StreamResponse:
    """The answer is written by a task of its own (proxy/background.py): the request returns the response queued, or
    follows its stream, which goes on if the client leaves. An unknown model is still this request's 404 wherever
    Velo can know it without generating (Router.served_info: not for an OpenAI-compatible backend, which may serve
    names it does not list, and whose refusal fails the response after `queued`), and a key over its limits, or a
    backend whose queue is full, its 429."""
    router, pipeline = request[ROUTER], request[PIPELINE]
    target = await router.resolve(parsed.model)
    await router.served_info(target)
    # a 429 for this request, not a failed response after `queued`: taken, not only checked, as a burst all passed it
    job = replace(job, share=pipeline.stage(Limit).reserve(job))
    try:
        job = replace(job, place=pipeline.stage(Admit).reserve(target.backend))
    except Overloaded:
        job.give_back()
        raise
    writer = ResponseStream(job.caller.request_id, parsed, compacting=parsed.compact, log=[])
    run = Run(writer, inputs, parsed.previous_response_id)
    store, tenant = request.app[RESPONSES], request[CALLER].tenant

    async def keep(record: StoredResponse) -> None:
        await store.put(tenant, record, None if parsed.store else POLL_KEEP_S)
    request.app[BACKGROUND].start(tenant, request[CALLER].client, run, holding(job, pipeline.generate(job)), keep,
                                  pipeline.inflight, request[GENERATION])
    request[RUNNING].observed_apart = True  # velo_requests counts the work once, by its model and backend
    if not parsed.stream:
        return json_response(writer.snapshot(), headers={**job.outcome.rate_limit,
                                                         **ignored_tools_header(parsed.ignored_tools)})
    # its id at once (response.created): a client that left before the first token, which a long prompt or a busy
    # backend puts minutes away, had nothing to follow again or cancel
    writer.encode(Chunk(heartbeat=True))
    run.release()
    return await _follow(request, run, -1, headers)


async def _follow(request: web.Request, run: Run, after: int,
                  headers: Callable[[], dict[str, str]] = dict) -> web.StreamResponse:
    """A background response's events after number `after`; the client leaving ends only this request."""
    return await write_stream(request, run.follow(after, request[GENERATION].config.server.heartbeat_s),
                              lambda events: events, lambda _: None, "text/event-stream", headers)


def _encoded_or(encode: Callable[[Chunk], bytes]) -> Callable[[Chunk | bytes], bytes]:
    """The writer's events for a chunk, or a finishing chunk's already written out (`stored_first`)."""
    return lambda item: item if isinstance(item, bytes) else encode(item)


async def compact(request: web.Request) -> web.Response:
    """Codex's first remote compaction: the conversation in; out, as OpenAI answers it, every user message followed by
    one compaction item."""
    body = await read_json(request)
    parsed = await _parsed(request, body)
    history = await _history(request, parsed)
    job = job_for(request, await parse_body(request, parsed.summary, history), body)
    whole = aggregate(await collect(request[PIPELINE].generate(job)))
    output = responses.user_items(history + parsed.items) + [responses.compaction_item(whole.text)]
    return json_response({"id": new_id("resp"), "object": "response.compaction",
                          "created_at": int(time.time()), "output": output,
                          "usage": responses.usage_object(whole.usage)}, headers=job.outcome.headers())


async def _parsed(request: web.Request, body: Any, counting: bool = False) -> responses.Parsed:
    """The request, each `item_reference` replaced by the stored item it names: the AI SDK's `openai(model)` (the
    Responses API, `store` on by default) sends every earlier turn back so, and its second request was a 400."""
    parsed = await parse_body(request, responses.parse_request, body, counting=counting)
    if not any(item.get("type") == "item_reference" for item in parsed.items):
        return parsed
    items = []
    for item in parsed.items:
        if item.get("type") == "item_reference":
            item_id = get(item, "id", str, required=True)
            item = await request.app[RESPONSES].item(request[CALLER].tenant, item_id)
            if item is None:
                raise responses.ItemNotFound(item_id)
        items.append(item)
    return replace(parsed, items=items)


async def _history(request: web.Request, parsed: responses.Parsed) -> list[dict[str, Any]]:
    if parsed.previous_response_id is None:
        return []
    store, tenant = request.app[RESPONSES], request[CALLER].tenant
    previous = await store.get(tenant, parsed.previous_response_id)
    if previous is None or not previous.kept():
        raise responses.PreviousResponseNotFound(parsed.previous_response_id)
    return await store.conversation(tenant, previous)


async def _keep(request: web.Request, parsed: responses.Parsed, record: StoredResponse) -> None:
    if parsed.store:
        await request.app[RESPONSES].put(request[CALLER].tenant, record)


async def _stored(request: web.Request) -> StoredResponse:
    """The response as stored, or as it stands while written in the background or streamed."""
    resp_id, tenant = request.match_info["id"], request[CALLER].tenant
    if (run := request.app[BACKGROUND].get(tenant, resp_id)) is not None:
        return run.snapshot()
    if (live := request.app[LIVE].get(tenant, resp_id)) is not None:
        return live.record(ended=False)
    found = await request.app[RESPONSES].get(tenant, resp_id)
    if found is None:
        raise NotFound(f"Response with id '{resp_id}' not found.")
    return found


async def retrieve(request: web.Request) -> web.StreamResponse:
    """`?stream=true` follows a background response's stream from its start, or from after the event numbered
    `starting_after`, as OpenAI resumes a dropped stream: live while it is written, from the stored events once it
    is done. OpenAI streams only background responses."""
    stream = request.query.get("stream", "false")
    if stream not in ("true", "false"):
        raise BadRequest("stream: must be true or false", param="stream")
    found = await _stored(request)
    if stream == "false":
        return json_response(found.response)
    run = request.app[BACKGROUND].get(request[CALLER].tenant, request.match_info["id"])
    if run is None and found.events is None:
        raise BadRequest("Only responses created with background: true can be streamed.", param="stream")
    events = run.writer.log if run is not None else await asyncio.to_thread(unpack_events, found.events or "")
    assert events is not None
    after = query_int(request.query, "starting_after", -1, -1, max(len(events) - 1, -1))
    if run is not None:
        return await _follow(request, run, after)
    return web.Response(body=b"".join(events[after + 1:]), content_type="text/event-stream",
                        headers={"Cache-Control": "no-cache"})


async def cancel(request: web.Request) -> web.Response:
    """Ends a background response being written, which is then stored as "cancelled" (with the output it had);
    cancelling it again returns it as it is. A finished response cannot be cancelled, nor one that was not in the
    background (400s, as OpenAI's)."""
    resp_id, tenant = request.match_info["id"], request[CALLER].tenant
    if (run := request.app[BACKGROUND].get(tenant, resp_id)) is not None:
        await _ended(request, run)
        return json_response((await _stored(request)).response)
    found = (await _stored(request)).response
    if not found.get("background"):
        raise BadRequest("Only responses created with background: true can be cancelled.")
    if found["status"] != "cancelled":
        raise BadRequest(f"Cannot cancel a {found['status']} response.")
    return json_response(found)


async def _ended(request: web.Request, run: Run) -> None:
    """Cancels `run` and waits until its response is stored (the cancel is its client's: "cancelled")."""
    request[PIPELINE].inflight.cancel(run.writer.resp_id, Cancelled("cancelled by its client"))
    assert run.task is not None
    await asyncio.wait([run.task])


async def delete(request: web.Request) -> web.Response:
    """A background response being written is cancelled first; one streamed is not stored at its end (it may be
    already, its last events still going out)."""
    resp_id, tenant = request.match_info["id"], request[CALLER].tenant
    if (run := request.app[BACKGROUND].get(tenant, resp_id)) is not None:
        await _ended(request, run)
    streaming = request.app[LIVE].delete(tenant, resp_id)
    if not await request.app[RESPONSES].delete(tenant, resp_id) and not streaming:
        raise NotFound(f"Response with id '{resp_id}' not found.")
    return json_response({"id": resp_id, "object": "response", "deleted": True})


async def input_items(request: web.Request) -> web.Response:
    return json_response(responses.input_page((await _stored(request)).input, request.query))


async def input_tokens(request: web.Request) -> web.Response:
    """The backend's own count where it has a tokenizer, else an estimate (token_count.py)."""
    parsed = await _parsed(request, await read_json(request), counting=True)
    req = await parse_body(request, parsed.chat, await _history(request, parsed))
    target, info, req = await as_sent(request[ROUTER], req, "responses")
    tokens, exact = await prompt_tokens(target, info, req)
    return json_response({"object": "response.input_tokens", "input_tokens": tokens},
                         headers={"X-Velo-Token-Count": "exact" if exact else "estimate"})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/v1/responses", create)
    r.add_post("/v1/responses/input_tokens", input_tokens)
    r.add_post("/v1/responses/compact", compact)
    r.add_get("/v1/responses/{id}", retrieve)
    r.add_delete("/v1/responses/{id}", delete)
    r.add_get("/v1/responses/{id}/input_items", input_items)
    r.add_post("/v1/responses/{id}/cancel", cancel)
