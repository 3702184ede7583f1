"""Streaming repair: content flows as it arrives, but text that may be a tool call is held back until it is
complete (or shown not to be one); the calls go out with the turn's last chunk. Dialect-free: the dialect writers
turn those chunks into OpenAI deltas or Ollama `message.tool_calls`.

A failed call attempt (unknown tool, arguments the schema rejects) is held too: it is shown as content once the
turn proves to have anything else, and a turn made only of failed attempts ends in `ToolCallInvalid` (502),
raised before its last chunk so that nothing half-valid is sent or cached.

Text that names no offered tool is the model's JSON answer, not a failed call, unless the request demands a call
(`tool_choice` "required" or a function): it is sent as content, as Ollama and llama-server send it (a 502 there
was retried by the SDKs into the same answer, on every unrelated question a small model answered in JSON). A turn
cut by its token limit is not the model's failure but the limit's: its unfinished call, even one that repair could
close, goes out as text, with finish reason `length`, as OpenAI sends a cut answer (a 502 there was retried by the
SDKs into the same cut; a closed one ran the tool on arguments cut mid-value). A stop string of the client's that
ends the turn inside a call cuts it the same way, and keeps finish reason `stop`.

A chunk whose text is all held does not go up at all: while a call is written for minutes, the route's heartbeats
keep the client (proxy/http_io.py).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import AsyncIterator, Callable, TypeVar

from adapters.protocol import ChatRequest, Chunk, CompletionRequest, TokenLogprob, Tool, ToolCall
from proxy.tools.budget import INLINE_CHARS, Budget, OverBudget, check_budget
from proxy.tools.calls import CallRepairer, RepairReport
from proxy.tools.extract import Region, could_be_call, is_partial_marker, next_start, region_at
from proxy.tools.metrics import ModelCounts
from proxy.tools.repair import MAX_REPAIR_CHARS
from proxy.tools.scan import EndSearch
from proxy.tools.structured import repair_structured

_OVERRIDABLE = (None, "stop", "length")
T = TypeVar("T")


def offered_tools(req: ChatRequest | CompletionRequest) -> list[Tool]:
    """Tools the model may call in this turn: none for completions or with OpenAI's tool_choice "none", only the
    named one when tool_choice names a function."""
    if not isinstance(req, ChatRequest) or req.tool_choice == "none":
        return []
    if isinstance(req.tool_choice, dict) and isinstance(req.tool_choice.get("function"), dict):
        name = req.tool_choice["function"].get("name")
        return [t for t in req.tools if t.name == name]
    return req.tools


def repair_stream(chunks: AsyncIterator[Chunk], req: ChatRequest | CompletionRequest,
                  metrics: ModelCounts | None = None, report: RepairReport | None = None,
                  budget: Budget | None = None, constrained: bool = False) -> AsyncIterator[Chunk]:
    """Wrap a chunk stream; with neither tools nor a format it is returned as is (no overhead).
    What was done is added to `report` as the stream runs and to `metrics` when it ends. Without a `budget`, all
    the work runs on the caller's loop (tests, benchmarks). `constrained`: the backend decodes the format under a
    grammar, so structured output streams as it comes and is checked at the end, and a demanded call is one."""
    report = report if report is not None else RepairReport()
    if tools := offered_tools(req):
        must = demands_a_call(req)
        repairer = CallRepairer(tools, report, forced=must and constrained)
        return _hold_back(chunks, HoldBack(repairer, must_call=must), metrics, budget)
    if req.format is not None:
        check = _check_structured if constrained else _buffer_structured
        return check(chunks, req, metrics, report, budget)
    return chunks


def demands_a_call(req: ChatRequest | CompletionRequest) -> bool:
    """`tool_choice` "required" or a named function: the turn must be a call."""
    return isinstance(req, ChatRequest) and (req.tool_choice == "required" or isinstance(req.tool_choice, dict))


def repair_message(text: str, tool_calls: list[ToolCall], tools: list[Tool],
                   must_call: bool = False) -> tuple[str, list[ToolCall], RepairReport]:
    """A whole assistant turn at once: the content left, the valid calls, what was done (ToolCallInvalid when
    only failed call attempts remain)."""
    if not tools:
        return text, tool_calls, RepairReport()
    state = HoldBack(CallRepairer(tools), must_call=must_call)
    calls = state.repairer.structured(tool_calls)
    segments, found = state.feed(text, final=True)
    content = state.release(segments) + state.close(calls + found)
    return content.strip(), calls + found, state.repairer.report


@dataclass
class HoldBack:
    """One turn's text state: text that may still become a call, and failed attempts not shown yet.

    `held` starts with the region being held; `search` goes on looking for its end as chunks extend it. A region
    that grows past MAX_REPAIR_CHARS is let go as text ("skipped=size"); once the repair budget is spent, the rest of
    the turn passes through as it comes ("skipped=budget")."""

    repairer: CallRepairer
    must_call: bool = False  # the request demands a call: text naming no offered tool is a failure too
    held: str = ""
    doubt: str = ""
    sent_text: bool = False
    sent_calls: bool = False
    search: EndSearch | None = None
    passthrough: bool = False
    in_code: bool = False  # inside a fenced block of another language, let go as it came: its closer is still to come

    def cost(self, text: str, final: bool) -> int:
        """Characters the next `feed` may have to repair (what decides whether it leaves the event loop): a chunk
        that only extends a held region is scanned where its search stopped, which is cheap whatever its size."""
        if self.passthrough:
            return 0
        size = len(self.held) + len(text)
        if len(text) > INLINE_CHARS or final or self.search is None:
            return size
        return size if self.search.find(self.held + text) is not None else len(text)

    def feed(self, text: str, final: bool, cut: bool = False) -> tuple[list[tuple[str, bool]], list[ToolCall]]:
        """Add text; return the segments that can be released now (text, is_failed_attempt) and the calls
        completed by it. `cut`: the turn ended at its token limit or a stop string of the client's."""
        held, self.held = self.held + text, ""
        search, self.search = self.search, None
        if self.passthrough:
            return [(held, False)], []
        if (i := next_start(held, self._past_code(held) if self.in_code else 0)) < 0:
            # most chunks: nothing in them may begin a call, returned at once (16.5 -> 15.2 thousand instructions a
            # chunk of text); a chunk of a call being written pays the call of `_regions` (41.3 -> 42.7 thousand)
            return [(held, False)], []
        segments: list[tuple[str, bool]] = []
        calls: list[ToolCall] = []
        pos = self._regions(held, i, final, cut, search, segments, calls)
        segments.append((held[pos:len(held) - len(self.held)], False))
        return segments, calls

    def _regions(self, held: str, i: int, final: bool, cut: bool, search: EndSearch | None,
                 segments: list[tuple[str, bool]], calls: list[ToolCall]) -> int:
        """Each region from `i` on that may be a call: repaired into `segments` and `calls`, or let go as text, or
        (one still being written) held, with its `search`, for the next chunk. Returns where the text not released
        yet begins: what was found before the repair budget ran out is kept."""
        pos = 0
        try:
            while i >= 0:
                check_budget()
                if not final and is_partial_marker(held, i):
                    self.held = held[i:]
                    break
                region = region_at(held, i, final, search if i == 0 else None)
                if region is None or (not region.complete and not could_be_call(region, self.repairer.arg_names)):
                    scan = self._past_text(held, i, region)
                elif region.end - region.start > MAX_REPAIR_CHARS:  # too large to hold or repair: text it stays
                    self.repairer.report.skipped.append("size")
                    scan = region.end
                elif not region.complete:
                    self.held, self.search = held[i:], _rebased(region.search, i)
                    break
                else:
                    pos = self._repair(held, region, cut, pos, segments, calls)
                    scan = region.end
                i = next_start(held, scan)
        except OverBudget:
            self.passthrough, self.held, self.search = True, "", None
            self.repairer.report.skipped.append("budget")
        return pos

    def _past_text(self, held: str, i: int, region: Region | None) -> int:
        """Where the scan goes on after a start at `i` that is no call: past a code block, else the next character.
        An unclosed code block's closer may begin in backticks at the end: those are held (`in_code`)."""
        if region is None or region.kind != "code":
            return i + 1
        if region.complete:
            return region.end
        self.in_code = True
        return region.body_start + self._past_code(held[region.body_start:])

    def _repair(self, held: str, region: Region, cut: bool, pos: int, segments: list[tuple[str, bool]],
                calls: list[ToolCall]) -> int:
        """A whole region repaired: its calls, or a failed attempt (held as such), with the text from `pos` before it
        into `segments`; returns where the text not released yet begins."""
        report = self.repairer.report
        invalid = len(report.invalid)
        found = self.repairer.region(region, cut)
        if found is None and len(report.invalid) == invalid:
            return pos
        segments.append((held[pos:region.start], False))
        if found is None:
            segments.append((held[region.start:region.end], True))
        calls += found or []
        return region.end

    def _past_code(self, text: str) -> int:
        """Where the scan for calls starts in `text` when a code block an earlier chunk opened is still open: after
        its closer, or at backticks at the end that may begin it (a ```python block's dict was read as a call once
        the chunk holding its header had gone)."""
        end = text.find("```")
        if end >= 0:
            self.in_code = False
            return end + 3
        return len(text.rstrip("`"))

    def release(self, segments: list[tuple[str, bool]]) -> str:
        """The text to send now: failed attempts wait in `doubt` until other non-blank text arrives."""
        out = []
        for text, failed in segments:
            if (failed or not text.strip()) and not self.sent_text:
                self.doubt += text
            else:
                out.append(self.doubt + text)
                self.doubt, self.sent_text = "", True
        return "".join(out)

    def close(self, last_calls: list[ToolCall], cut: bool = False) -> str:
        """End of turn: the text still owed, or ToolCallInvalid when the turn was only failed attempts and not
        `cut` (text naming no offered tool fails only a turn that `must_call`)."""
        self.sent_calls |= bool(last_calls)
        report = self.repairer.report
        if report.failed(self.must_call) and not self.sent_text and not self.sent_calls and not cut:
            raise report.error()
        doubt, self.doubt = self.doubt, ""
        return doubt if doubt.strip() else ""

    def out(self, chunk: Chunk, text: str, calls: list[ToolCall]) -> Chunk:
        """The chunk to send: empty when everything in it is still held."""
        self.sent_calls |= bool(calls)
        finish = chunk.finish_reason
        if finish in _OVERRIDABLE and finish and self.sent_calls:
            finish = "tool_calls"
        elif finish == "tool_calls" and not self.sent_calls:  # the backend's calls were all dropped
            finish = "stop"
        return replace(chunk, text=text, tool_calls=calls, finish_reason=finish)


def _rebased(search: EndSearch | None, shift: int) -> EndSearch | None:
    """The search of a region that moves `shift` characters to the front of the held text; a JSON value found whole
    and waiting for what follows it (stray closers) moves its end too."""
    if search is not None and shift:
        search.pos -= shift  # type: ignore[attr-defined]
        if getattr(search, "end", None) is not None:
            search.end -= shift  # type: ignore[attr-defined]
    return search


async def _run(budget: Budget | None, fn: Callable[..., T], *args: object, size: int) -> T:
    return fn(*args) if budget is None else await budget.run(fn, *args, size=size)


async def _hold_back(chunks: AsyncIterator[Chunk], state: HoldBack, metrics: ModelCounts | None,
                     budget: Budget | None) -> AsyncIterator[Chunk]:
    """Text flows; calls are all sent with the last chunk, so that a dialect numbering the calls of one chunk
    (OpenAI's `index`) gives each call of the turn its own number."""
    last = Chunk(finish_reason="stop")  # used when the stream ends without a finish_reason
    calls: list[ToolCall] = []
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            calls += state.repairer.structured(chunk.tool_calls) if chunk.tool_calls else []
            if chunk.finish_reason is not None:
                last = chunk
                break
            segments, found = await _run(budget, state.feed, chunk.text, False, size=state.cost(chunk.text, False))
            calls += found
            if not (out := state.out(chunk, state.release(segments), [])).empty:
                yield out
    cut = _cut(last)
    segments, found = await _run(budget, state.feed, last.text, True, cut, size=state.cost(last.text, True))
    text = state.release(segments)
    calls += found
    try:
        text += state.close(calls, cut=cut)
    finally:
        if metrics is not None:
            metrics.record(state.repairer.report)
    yield state.out(last, text, calls)


async def _check_structured(chunks: AsyncIterator[Chunk], req: ChatRequest | CompletionRequest,
                            metrics: ModelCounts | None, report: RepairReport,
                            budget: Budget | None) -> AsyncIterator[Chunk]:
    """A grammar-constrained answer flows token by token, as Ollama streams it; the whole is checked before the
    last chunk (past the repair budget, not at all), and one that does not parse ends the stream in
    StructuredOutputInvalid (never cached). An answer cut by max_tokens, or by a stop string of the client's (where
    the backend says which: the engine does), is sent as it is, as Ollama sends it: that JSON is the client's cut.
    """
    parts: list[str] = []
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            parts.append(chunk.text)
            if _whole(chunk):
                await _structured(budget, "".join(parts), req, metrics, report)
            yield chunk


async def _buffer_structured(chunks: AsyncIterator[Chunk], req: ChatRequest | CompletionRequest,
                             metrics: ModelCounts | None, report: RepairReport,
                             budget: Budget | None) -> AsyncIterator[Chunk]:
    """JSON can only be checked whole: hold all text and its logprobs (those of the tokens the model wrote, repaired
    or not), pass everything else, send the repaired text last (or, past the repair budget, the text as it came).
    An answer cut by max_tokens, or by a stop string of the client's, is sent as it came, as _check_structured sends
    it: a 502 ("does not match the requested schema") there was retried by the SDKs into the same cut, where
    OpenAI's finish reason `length` makes them raise LengthFinishReasonError."""
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    last = Chunk(finish_reason="stop")
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            parts.append(chunk.text)
            logprobs += chunk.logprobs
            if chunk.finish_reason is not None:
                last = chunk
                break
            if not (held := replace(chunk, text="", logprobs=[])).empty:
                yield held  # its thinking, say
    text = "".join(parts)
    if _whole(last):
        text = await _structured(budget, text, req, metrics, report)
    yield replace(last, text=text, logprobs=logprobs)


def _cut(last: Chunk) -> bool:
    """Whether max_tokens or a stop string of the client's ended the turn (where the backend says which: the engine
    does). A forced call the engine wrote `{"city": "Rome"}` for, cut by the stop string "Rome", was closed by repair
    to `{"city": ""}` and sent as the call (finish `tool_calls`); with a second required argument it was a 502."""
    return last.finish_reason == "length" or last.stop_sequence is not None


def _whole(last: Chunk) -> bool:
    """The model ended the answer itself: neither max_tokens nor a stop string of the client's cut its JSON."""
    return last.finish_reason == "stop" and last.stop_sequence is None


async def _structured(budget: Budget | None, text: str, req: ChatRequest | CompletionRequest,
                      metrics: ModelCounts | None, report: RepairReport) -> str:
    """`text` repaired to the request's format, or StructuredOutputInvalid; past the repair budget, as it came."""
    try:
        return await _run(budget, repair_structured, text, req.format, report, size=len(text))
    except OverBudget:
        report.skipped.append("budget")
        return text
    finally:
        if metrics is not None:
            metrics.record(report)
