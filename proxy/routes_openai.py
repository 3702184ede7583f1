"""OpenAI API handlers under /v1: parse -> pipeline -> write (the model list, shared with Anthropic's API:
routes_models.py). `n > 1` runs n jobs side by side, each asking its backend for one generation, and a completions
batch (a prompt array) n jobs for each prompt (`best_of` jobs where it asks for more, best_of.py ranking them)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, AsyncIterator, Callable

from aiohttp import web

from adapters.protocol import Chunk, CompletionRequest, Usage, aggregate

from .auth import CALLER
from .best_of import best, candidates
from .dialects import SSE_KEEPALIVE, openai
from .http_io import (SSE_DONE, ignored_tools_header, job_for, json_response, parse_body, read_json, sse,
                      write_stream)
from .job import Job, Parts, Request
from .state import PIPELINE
from .stream_ends import as_streamed
from .streams import collect_each, merge
from .token_count import estimate


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req, functions = await parse_body(request, openai.parse_chat, body), openai.legacy_functions(body)
    ignored = ignored_tools_header(openai.hosted_tools(body))
    jobs = _parts(_choices(request, req, body))
    streams = [request[PIPELINE].generate(job) for job in jobs]
    ids = openai.ChatIds("chatcmpl")
    if not req.stream:
        choices = [aggregate(c) for c in await collect_each(streams)]
        return json_response(openai.chat_completion(ids, req.model, choices, functions),
                             headers={**_headers(jobs), **ignored})
    calls_sent = [0] * len(streams)

    def shape(i: int, chunk: Chunk) -> dict:
        obj = openai.chat_chunk(ids, req.model, i, chunk, calls_sent=calls_sent[i], functions=functions)
        calls_sent[i] += len(chunk.tool_calls)
        return obj

    return await _sse(request, jobs, streams, shape,
                      openai.stream_options_usage(body), ids, req.model, "chat.completion.chunk", opening=True,
                      n=len(jobs), headers=ignored)


async def completions(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    reqs, echo, best_of = await parse_body(request, openai.parse_completions, body)
    req = reqs[0]
    prompts = [r.prompt for r in reqs for _ in range(r.n)]  # each choice's, for echo
    ids = openai.ChatIds("cmpl")
    if not req.stream:  # best_of's always: parse_completions refuses it streamed
        asked = ([job for r in reqs for job in _choices(request, r, body)] if best_of is None else
                 _candidates(request, reqs, best_of, body))
        jobs, answers = await _answers(request, asked)
        usage = openai.total_usage(enumerate(a.usage for a in answers), best_of or req.n)  # every candidate's tokens
        choices, headers = (answers, {}) if best_of is None else best(answers, best_of, req.n, req.options.logprobs)
        if echo:
            for c, prompt in zip(choices, prompts):
                c.text = prompt + c.text
        return json_response(openai.completion_object(ids, req.model, choices, usage=usage),
                             headers=_headers(jobs) | headers)
    jobs = _parts([job for r in reqs for job in _choices(request, r, body)])
    streams = [request[PIPELINE].generate(job) for job in jobs]
    if echo:
        streams = [_echoed(s, prompt) for s, prompt in zip(streams, prompts)]
    written = [0] * len(jobs)  # characters each choice has streamed, for logprobs' text_offset

    def shape(i: int, chunk: Chunk) -> dict:
        obj = openai.completion_chunk(ids, req.model, i, chunk, written[i])
        written[i] += len(chunk.text)
        return obj

    return await _sse(request, jobs, streams, shape, openai.stream_options_usage(body), ids, req.model,
                      "text_completion", opening=False, n=req.n)


async def _answers(request: web.Request, jobs: list[Job]) -> tuple[list[Job], list[Chunk]]:
    """Every job's answer, whole, generated side by side as parts of one request; with their jobs, for the
    response's headers."""
    jobs = _parts(jobs)
    return jobs, [aggregate(c) for c in await collect_each([request[PIPELINE].generate(job) for job in jobs])]


def _candidates(request: web.Request, reqs: list[CompletionRequest], best_of: int,
                body: dict[str, Any]) -> list[Job]:
    """Each prompt's `best_of` candidates, asked with logprobs to rank them by. Where the client asked for none they
    are Velo's own (Job.own_logprobs): a backend that refuses them is asked again without them, and the candidates
    are answered unranked; a refusal of logprobs the client asked for is the client's 400."""
    own = not reqs[0].options.logprobs
    return [replace(job, own_logprobs=own) for r in reqs for job in _choices(request, candidates(r, best_of), body)]


async def _echoed(stream: AsyncIterator[Chunk], prompt: str) -> AsyncIterator[Chunk]:
    """The prompt as the choice's first text, as OpenAI streams `echo`; sent with the backend's first chunk, so a
    request that fails before one still answers with its error status."""
    pending = bool(prompt)
    try:
        async for chunk in stream:
            if pending:
                pending = False
                yield Chunk(text=prompt)
            yield chunk
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


def _parts(jobs: list[Job]) -> list[Job]:
    """Several jobs that answer one request: its parts, one request to the key's limits (job.py `Parts`)."""
    if len(jobs) == 1:
        return jobs
    parts = Parts(len(jobs), sum(estimate(j.request) for j in jobs))
    return [replace(job, parts=parts, part=i) for i, job in enumerate(jobs)]


def _choices(request: web.Request, req: Request, body: dict[str, Any]) -> list[Job]:
    """One job per choice, each asking for one generation; a seeded request gets distinct but reproducible seeds
    per choice."""
    def nth(i: int) -> Request:
        seed = req.options.seed
        if i == 0 or seed is None:
            return req if req.n == 1 else replace(req, n=1)
        seed = (seed + i) % 2**63  # signed 64 bits, as OpenAI's and vLLM's seed is (vLLM refused 2**63 with a 400)
        return replace(req, n=1, options=replace(req.options, seed=seed))
    return [job_for(request, nth(i), body) for i in range(req.n)]


def _headers(jobs: list[Job]) -> dict[str, str]:
    """One response for n jobs: the first's outcome (they share their cacheability and limits), every job's
    repairs."""
    if len(jobs) == 1:
        return jobs[0].outcome.headers()
    return replace(jobs[0].outcome, repairs=[r for j in jobs for r in j.outcome.repairs]).headers()


async def _sse(request: web.Request, jobs: list[Job], streams: list[AsyncIterator[Chunk]],
               shape: Callable[[int, Chunk], dict], include_usage: bool, ids: openai.ChatIds, model_name: str,
               obj: str, opening: bool, n: int, headers: dict[str, str] | None = None) -> web.StreamResponse:
    """`n`: choices per prompt (a completions batch has several prompts), for the usage chunk; `headers`: the
    response's own besides the jobs'."""
    events = _Events(ids, model_name, obj, shape, opening, n, include_usage, len(streams))
    items, encoded, ended, beat = events.written(streams)
    return await write_stream(request, items, encoded, lambda e: sse(openai.error_object(e)), "text/event-stream",
                              lambda: {**_headers(jobs), **(headers or {})},
                              SSE_DONE, events.finish, heartbeat=beat, ends=ended)


@dataclass(slots=True)
class _Events:
    """One streamed answer's choices as SSE events: which have opened, which still answer, the usage each reported
    (for the usage chunk `finish` writes where the client asked for it with include_usage). Slots, read for every
    piece where a closure's cells were."""

    ids: openai.ChatIds
    model_name: str
    obj: str
    shape: Callable[[int, Chunk], dict]
    opening: bool  # each choice opens with a role delta (chat's)
    n: int
    include_usage: bool
    unfinished: int  # choices still answering
    opened: int = 0  # choices opened, which open in index order
    usages: list[tuple[int, Usage]] = field(default_factory=list)
    event: Callable[[dict], bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.event = _null_usage if self.include_usage else sse  # chosen once: a call more for each piece else

    def written(self, streams: list[AsyncIterator[Chunk]]
                ) -> tuple[AsyncIterator[Any], Callable[[Any], bytes], Callable[[Any], bool], Any]:
        """What `write_stream` takes of the choices' `streams`: the items, how each is encoded and whether it ends
        the answer, and the heartbeat's item."""
        if len(streams) == 1:  # n = 1, the common case: its chunks are choice 0's without `merge`, a generator that
            # only paired each with 0 (a 256-piece stream's 25,038 -> 24,559 thousand instructions a request without
            # it, bench/proxy_instructions.py, the mean of runs under PYTHONHASHSEED 0, 1, 2); a partial of the plain
            # function, as one of the bound method, `partial(self.encode, 0)`, calls through two layers (23,014 ->
            # 22,960 thousand)
            return as_streamed(streams[0]), partial(_Events.encode, self, 0), self.ends, Chunk(heartbeat=True)
        return (merge([as_streamed(s) for s in streams]), lambda item: self.encode(*item),
                lambda item: self.ends(item[1]), (0, Chunk(heartbeat=True)))

    async def finish(self) -> bytes:
        """The usage chunk, where the client asked for it."""
        if not self.include_usage:
            return b""
        return sse(openai.usage_chunk(self.ids, self.model_name, self.obj, self.usages, self.n))

    def encode(self, index: int, chunk: Chunk) -> bytes:
        """Choice `index`'s chunk as its event, after the role deltas of the choices it opens."""
        if chunk.usage is not None:
            self.usages.append((index, chunk.usage))
        head = self._open(index) if self.opening and index >= self.opened else b""
        if chunk.heartbeat:
            return head or SSE_KEEPALIVE
        event, shape = self.event, self.shape  # slots read: `self.event(...)` looks a method up (+52 thousand)
        return head + event(shape(index, chunk))

    def _open(self, index: int) -> bytes:
        """The role deltas OpenAI opens each choice with, for every choice up to `index` not opened yet: the openai
        package's stream helper files a choice where it first appears, so choices before this one open first
        (choice 1 first was its IndexError)."""
        head = b"".join(self.event(openai.chat_chunk(self.ids, self.model_name, i, None, first=True))
                        for i in range(self.opened, index + 1))
        self.opened = index + 1
        return head

    def ends(self, chunk: Chunk) -> bool:
        """Whether `chunk` ends the answer: the last choice still answering finished."""
        self.unfinished -= chunk.finish_reason is not None
        return self.unfinished == 0


def _null_usage(obj: dict) -> bytes:
    """With include_usage, every chunk before the usage chunk has `usage: null`, as OpenAI sends them."""
    obj["usage"] = None
    return sse(obj)


async def embeddings(request: web.Request) -> web.Response:
    req, encoding = await parse_body(request, openai.parse_embeddings, await read_json(request))
    result, headers = await request[PIPELINE].embed(req, request[CALLER])
    return json_response(openai.embeddings_object(req.model, result, encoding), headers=headers)


def add_routes(app: web.Application) -> None:
    r = app.router
    for prefix in ("/v1", ""):  # also without /v1, as llama-server answers them (dialects.UNVERSIONED)
        r.add_post(f"{prefix}/chat/completions", chat_completions)
        r.add_post(f"{prefix}/completions", completions)
        r.add_post(f"{prefix}/embeddings", embeddings)
