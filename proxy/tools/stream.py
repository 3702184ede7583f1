"""Streaming repair: content flows as it arrives, but text that may be a tool call is held back until it is
complete (or shown not to be one), then sent as one `Chunk(tool_calls=...)`. Dialect-free: the dialect writers
turn those chunks into OpenAI deltas or Ollama `message.tool_calls`."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import AsyncIterator

from adapters.protocol import ChatRequest, Chunk, ToolCall
from proxy.tools.calls import CallRepairer, RepairReport, unusable
from proxy.tools.extract import could_be_call, is_partial_marker, next_start, region_at
from proxy.tools.metrics import ToolMetrics
from proxy.tools.structured import repair_structured

_OVERRIDABLE = (None, "stop", "length")


def repair_stream(
    chunks: AsyncIterator[Chunk], req: ChatRequest, metrics: ToolMetrics | None = None
) -> AsyncIterator[Chunk]:
    """Wrap a chunk stream; with neither tools nor a format the stream is returned as is (no overhead)."""
    if req.tools:
        return _hold_back(chunks, _HoldBack(CallRepairer(req.tools)), req.model, metrics)
    if req.format is not None:
        return _buffer_structured(chunks, req, metrics)
    return chunks


@dataclass
class _HoldBack:
    repairer: CallRepairer
    held: str = ""
    sent_text: bool = False
    sent_calls: bool = False
    finished: bool = field(default=False)

    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        """Add text; return what can be shown now and the calls completed by it."""
        held, self.held = self.held + text, ""
        pieces, calls, pos, scan = [], [], 0, 0
        while (i := next_start(held, scan)) >= 0:
            if not final and is_partial_marker(held, i):
                self.held = held[i:]
                break
            region = region_at(held, i, final)
            if region is None or (not region.complete and not could_be_call(region)):
                scan = i + 1
                continue
            if not region.complete:
                self.held = held[i:]
                break
            found = self.repairer.region(region)
            if found is not None:
                pieces.append(held[pos:region.start])
                calls += found
                pos = region.end
            scan = region.end
        end = len(held) - len(self.held)
        pieces.append(held[pos:end])
        return "".join(pieces), calls

    def out(self, chunk: Chunk, text: str, calls: list[ToolCall]) -> Chunk | None:
        """The chunk to send, or None when everything in it is still held."""
        self.sent_text |= bool(text.strip())
        self.sent_calls |= bool(calls)
        finish = chunk.finish_reason
        if finish in _OVERRIDABLE and finish and self.sent_calls:
            finish = "tool_calls"
        new = replace(chunk, text=text, tool_calls=calls, finish_reason=finish)
        empty = not (text or calls or new.thinking or new.logprobs or finish or new.usage or new.context)
        return None if empty else new


async def _hold_back(
    chunks: AsyncIterator[Chunk], state: _HoldBack, model: str, metrics: ToolMetrics | None
) -> AsyncIterator[Chunk]:
    last: Chunk | None = None
    async for chunk in chunks:
        calls = state.repairer.structured(chunk.tool_calls) if chunk.tool_calls else []
        final = chunk.finish_reason is not None
        text, found = state.feed(chunk.text, final) if chunk.text or final else ("", [])
        last = state.out(chunk, text, calls + found)
        if last is not None:
            yield last
        if final:
            break
    if state.held:  # the stream ended without a finish_reason
        text, found = state.feed("", final=True)
        yield state.out(Chunk(), text, found) or Chunk()
    _finish(state, model, metrics)


def _finish(state: _HoldBack, model: str, metrics: ToolMetrics | None) -> None:
    report: RepairReport = state.repairer.report
    if metrics is not None:
        metrics.record(model, report)
    if unusable("x" if state.sent_text else "", [True] if state.sent_calls else [], report):
        raise report.error()


async def _buffer_structured(
    chunks: AsyncIterator[Chunk], req: ChatRequest, metrics: ToolMetrics | None
) -> AsyncIterator[Chunk]:
    """JSON can only be checked whole: hold all text, pass everything else, send the repaired text last."""
    parts: list[str] = []
    async for chunk in chunks:
        parts.append(chunk.text)
        if chunk.finish_reason is None:
            if chunk.thinking or chunk.usage:
                yield replace(chunk, text="", logprobs=[])
            continue
        yield _structured_final(chunk, "".join(parts), req, metrics)
        return
    if parts:
        yield _structured_final(Chunk(finish_reason="stop"), "".join(parts), req, metrics)


def _structured_final(chunk: Chunk, text: str, req: ChatRequest, metrics: ToolMetrics | None) -> Chunk:
    fixed, report = repair_structured(text, req.format)
    if metrics is not None:
        metrics.record(req.model, report)
    return replace(chunk, text=fixed)
