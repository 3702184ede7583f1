"""Embedding micro-batching: concurrent embed requests for one model become one backend call.

Codebase indexing (Continue, Open WebUI) fires many small embed calls at once; a backend embeds a batch of N
inputs far faster than N separate calls. Requests wait at most `window_ms` for company, or less once the batch
holds `max_inputs` inputs; only requests that agree on every option are merged. A batch the backend refuses for
one input (a 400, 413 or 422: an input past the context, say; or an error the same input meets again, such as
Ollama's refusal of a NaN vector) is asked again caller by caller, so that no caller hears of another's input.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, Awaitable, Callable

from adapters.errors import BackendError, VeloError
from adapters.protocol import EmbedRequest, EmbedResult
from adapters.wording import counted

from ..keep import Tally

EmbedCall = Callable[[EmbedRequest], Awaitable[EmbedResult]]
Slot = Callable[[str], contextlib.AbstractAsyncContextManager[Any]]  # a slot for the call, taken in a client's turn


@dataclass
class _Batch:
    requests: list[EmbedRequest] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)  # each request's, whose turn in the backend's queue it takes
    inputs: int = 0
    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task | None = None  # its backend call, once flushed


@dataclass
class EmbedBatcher:
    call: EmbedCall
    window_ms: float = 5
    max_inputs: int = 64
    calls: Tally = field(default_factory=Tally)  # backend calls made, for /metrics (kept through reloads)
    # one of the backend's slots (its admission queue), held for each call: a batch takes its callers' inputs once
    # it has one, so a caller that left while the batch waited for it is not sent. It waits in its first caller's
    # line: in one line for all ("embeddings"), one key's single embedding waited behind every call another key's
    # indexing had queued, where a generation takes turns with the other clients'
    slot: Slot = contextlib.nullcontext
    name: str = ""  # the backend's, for its errors: with several backends, "backend returned ..." named none
    _open: dict[str, _Batch] = field(default_factory=dict)
    _tasks: set[asyncio.Task] = field(default_factory=set)

    async def embed(self, req: EmbedRequest, client: str = "") -> EmbedResult:
        """`req`'s vectors; `client` is the caller's (Caller.client), for its turn in the backend's queue."""
        if not req.inputs or len(req.inputs) >= self.max_inputs:  # nothing to gain from waiting
            async with self.slot(client):
                self.calls.n += 1
                return await self.call(req)
        key = _batch_key(req)
        batch = self._open.get(key)
        if batch is not None and batch.inputs + len(req.inputs) > self.max_inputs:
            self._flush(key)
            batch = None
        if batch is None:
            batch = self._open[key] = _Batch()
            batch.timer = asyncio.get_running_loop().call_later(self.window_ms / 1000, self._flush, key)
        future = asyncio.get_running_loop().create_future()
        batch.requests.append(req)
        batch.futures.append(future)
        batch.clients.append(client)
        batch.inputs += len(req.inputs)
        if batch.inputs >= self.max_inputs:
            self._flush(key)
        try:
            return await future
        except asyncio.CancelledError:  # the last caller to leave cancels the backend call: it ran on for nobody
            if batch.task is not None and all(f.done() for f in batch.futures):
                batch.task.cancel()
            raise

    async def close(self) -> None:
        """Cancels batches in flight (shutdown); their callers get CancelledError."""
        for key in list(self._open):
            self._flush(key)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _flush(self, key: str) -> None:
        batch = self._open.pop(key, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        task = batch.task = asyncio.create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: _Batch) -> None:
        live = _waiting(batch)  # callers that left need no inputs
        if not live:
            return
        try:
            async with self.slot(batch.clients[live[0]]):
                live = _waiting(batch)  # nor those that left while it waited for the slot
                if not live:
                    return
                first = batch.requests[live[0]]
                merged = replace(first, inputs=[s for i in live for s in batch.requests[i].inputs])  # the rest equal
                self.calls.n += 1
                result = await self.call(merged)
            if len(result.embeddings) != len(merged.inputs):
                raise BackendError(f"backend {self.name!r} returned {counted(len(result.embeddings), 'embedding')} "
                                   f"for {counted(len(merged.inputs), 'input')}")
            parts = _split(result, [batch.requests[i] for i in live])  # failing, it fails each caller: none hangs
        except asyncio.CancelledError:
            for i in live:
                batch.futures[i].cancel()
            raise
        except Exception as e:
            if isinstance(e, VeloError) and (e.status in _THE_INPUTS or e.repeats) and len(live) > 1:
                # one caller's input (too long, or embedded to NaN): each caller is asked alone, so only it hears of it
                await asyncio.gather(*(self._run(_Batch([batch.requests[i]], [batch.futures[i]], [batch.clients[i]]))
                                       for i in live))
                return
            for i in live:
                if not batch.futures[i].done():
                    batch.futures[i].set_exception(e)
            return
        for i, part in zip(live, parts):
            if not batch.futures[i].done():
                batch.futures[i].set_result(part)


def _waiting(batch: _Batch) -> list[int]:
    """The places of the batch's callers still waiting for its answer."""
    return [i for i, f in enumerate(batch.futures) if not f.done()]


# What one caller's input can make a backend refuse; not a full queue's or a wait's 429, on which each caller asked
# alone queued again for as long (twice `queue_timeout_s` before the 429)
_THE_INPUTS = (400, 413, 422)


def _batch_key(req: EmbedRequest) -> str:
    """Requests merge only when everything but the inputs is equal (read from the dataclass: a field added to
    EmbedRequest and written out here by hand could be forgotten, and requests differing in it merged), and their
    inputs are of one kind: vLLM takes texts or token ids in a request, never both."""
    key = {f.name: getattr(req, f.name) for f in fields(req) if f.name != "inputs"} | {"tokenized": req.tokenized}
    return json.dumps(key, sort_keys=True, default=str)


def _split(result: EmbedResult, requests: list[EmbedRequest]) -> list[EmbedResult]:
    """One result per request: its inputs' own token counts where the backend says them (the engine), else the
    batch's shared out by input length (an input cut to the window counts its characters, so a short request
    beside it got 0); timings are the batch's, since every member waited for all of it."""
    total_chars = sum(len(s) for r in requests for s in r.inputs) or 1
    parts, start = [], 0
    for r in requests:
        end = start + len(r.inputs)
        if result.input_tokens is not None:
            tokens = sum(result.input_tokens[start:end])
        else:
            tokens = round(result.prompt_tokens * sum(len(s) for s in r.inputs) / total_chars)
        parts.append(EmbedResult(embeddings=result.embeddings[start:end], prompt_tokens=tokens,
                                 load_ns=result.load_ns,
                                 input_tokens=None if result.input_tokens is None else result.input_tokens[start:end]))
        start = end
    return parts
