"""The repaired answer the pipeline sends, with retry on invalid (config `tools.max_retries`, off by default).

With retries off the repaired stream flows through as it is made. With retries on, each attempt is read whole
(a streamed answer cannot be taken back; the route's heartbeats keep a streaming client meanwhile), and an
answer whose tool calls or JSON stay invalid after repair is asked again with the validation error appended to the
conversation; the first valid answer is sent. A call to a tool that was not offered is asked again too (with the
names of those that were), where without retries it goes out as the model's JSON text: retries are the client's
choice to spend generations on a call, and a small model's made-up tool name is far more often a failed call than
a JSON answer that happens to look like one. When every attempt fails, the last usable answer is sent, or the
last error raised.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from typing import AsyncIterator, Callable

from adapters.protocol import ChatRequest, Chunk, CompletionRequest, Message, Usage
from proxy.tools.budget import Budget
from proxy.tools.calls import RepairReport, ToolCallInvalid
from proxy.tools.metrics import ModelCounts
from proxy.tools.stream import offered_tools, repair_stream
from proxy.tools.structured import StructuredOutputInvalid

log = logging.getLogger("velo.tools")

Request = ChatRequest | CompletionRequest
RunFn = Callable[[Request], AsyncIterator[Chunk]]
_INVALID = (ToolCallInvalid, StructuredOutputInvalid)


def with_retry(run: RunFn, req: Request, max_retries: int, metrics: ModelCounts, notes: list[str],
               budget: Budget | None = None, constrained: bool = False,
               calls: list[int] | None = None) -> AsyncIterator[Chunk]:
    """`run(req)` streams the backend's raw answer to `req`, which offers tools or asks for a format (the repair
    stage wraps no other: stages/repair.py); what repair did is appended to `notes` (the X-Velo-Repair header) and
    logged. Completions are repaired but never retried: there is no conversation to append to. Every
    attempt shares `budget` (proxy/tools/budget.py). `constrained`: the backend enforces `format` with a grammar
    (structured output then streams unbuffered). Where answers are retried, each attempt's tokens (prompt and output,
    as its backend counted them) are appended to `calls`: the answer sent carries only its own usage."""
    if max_retries <= 0 or not isinstance(req, ChatRequest):
        return _streamed(run, req, metrics, notes, budget, constrained)
    return _retried(run, req, max_retries, metrics, notes, budget, constrained, [] if calls is None else calls)


async def _streamed(run: RunFn, req: Request, metrics: ModelCounts, notes: list[str],
                    budget: Budget | None, constrained: bool) -> AsyncIterator[Chunk]:
    report = RepairReport()
    try:
        async with contextlib.aclosing(repair_stream(run(req), req, metrics, report, budget,
                                                     constrained)) as stream:
            async for chunk in stream:
                yield chunk
    except _INVALID as e:
        e.repeats = req.options.deterministic
        raise
    finally:
        _note(report, req.model, notes)


async def _retried(run: RunFn, req: ChatRequest, max_retries: int, metrics: ModelCounts, notes: list[str],
                   budget: Budget | None, constrained: bool, calls: list[int]) -> AsyncIterator[Chunk]:
    attempt, usable, error = req, None, None
    for n in range(max_retries + 1):
        if n:
            metrics.retried += 1
            notes.append(f"retry={n}")
        raw: list[str] = []
        used: list[Usage] = []
        report = RepairReport()
        try:
            chunks: list[Chunk] = []
            async with contextlib.aclosing(repair_stream(_tee(run(attempt), raw, used), req, metrics, report,
                                                         budget, constrained)) as s:
                async for chunk in s:
                    chunks.append(chunk)
            usable, error = chunks, (report.error() if report.invalid else None)
        except _INVALID as e:
            error = e
        finally:
            _note(report, req.model, notes)
            if used:
                calls.append(used[-1].prompt_tokens + used[-1].completion_tokens)
        if error is None or n == max_retries:
            break
        attempt = ask_again(attempt, "".join(raw), error.message)
    if usable is None:
        assert error is not None
        error.repeats = req.options.deterministic
        raise error
    for chunk in usable:
        yield chunk


def ask_again(req: ChatRequest, answer: str, error: str) -> ChatRequest:
    """The conversation so far, the invalid answer, and a user turn saying what was wrong with it."""
    if offered_tools(req):
        names = ", ".join(t.name for t in offered_tools(req))
        fix = f"Call only the offered tools ({names}), with arguments that match their JSON Schema."
    else:
        fix = "Answer with JSON only, matching the requested format."
    retry = Message("user", f"Your previous answer was invalid: {error}\n{fix}")
    return replace(req, messages=[*req.messages, Message("assistant", answer), retry])


async def _tee(chunks: AsyncIterator[Chunk], raw: list[str], used: list[Usage]) -> AsyncIterator[Chunk]:
    """Pass `chunks` through, keeping the raw text for `ask_again` and the backend's usage (an answer that repair
    finds invalid may end before its usage goes on)."""
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            raw.append(chunk.text)
            if chunk.usage is not None:
                used.append(chunk.usage)
            yield chunk


def _note(report: RepairReport, model: str, notes: list[str]) -> None:
    if report.changed:
        summary = report.summary()
        notes.append(summary)
        log.info("tool/format repair for %s: %s", model, summary)
