"""Internal chunks -> the Responses API's event stream, each event numbered by `sequence_number`:

    response.created, response.in_progress
    per output item: response.output_item.added, its parts and deltas, response.output_item.done
        reasoning: reasoning_summary_part.added, reasoning_summary_text.delta/.done, reasoning_summary_part.done
        message: content_part.added, output_text.delta/.done, content_part.done
        function call: function_call_arguments.delta/.done (custom tools: custom_tool_call_input.delta/.done)
    response.completed (its response's status "incomplete" when the output limit ran out) | response.failed

A compaction's stream (`compacting`): response.compaction.compacting while the summary is written, then its one
output item, the compaction item with the whole summary (output_item.added and .done).

A background response's events are kept (`log`), so that its stream can be followed from any event on, while it is
written and once it is stored (proxy/background.py).

A client that reads its output only from `response.output_item.done` (Codex does) gets every item there, and
`response.completed` ends every stream that did not fail: OpenAI sends `response.incomplete` instead when the
output limit ran out, but Codex retries a stream without `response.completed` and the SDK's stream helper
raises; Ollama ends with `response.completed` too.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


from adapters.errors import BackendError, VeloError
from adapters.exact_json import dumps
from adapters.protocol import Chunk, FinishReason, TokenLogprob, Usage

from . import new_id
from .openai import error_object, token_logprobs
from .responses import (Parsed, call_item, compaction_item, message_item, reasoning_item, response_object, status_of)


@dataclass
class ResponseStream:
    resp_id: str
    parsed: Parsed
    created_at: float = field(default_factory=time.time)
    sequence: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)  # finished items
    open: dict[str, Any] | None = None  # the reasoning or message item being filled
    # of the open item, in the pieces it came in: `+=` on an attribute copies the whole text at every chunk
    pieces: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the open message's text, when asked for
    final: dict[str, Any] | None = None  # the response object once the stream ended
    compacting: bool = False  # the text is a summary, sent as one compaction item
    compaction_id: str = field(default_factory=lambda: new_id("cmp"))
    # every event written, one entry each (the index is its sequence_number), when kept: a background response's
    # stream is sent again from any event on (proxy/background.py)
    log: list[bytes] | None = None

    def encode(self, chunk: Chunk) -> bytes:
        if self.final is not None:  # a heartbeat while the route stores the response (routes_responses.py)
            return b""
        if chunk.heartbeat:
            # the API has no keepalive event, and Codex's idle timer counts events, not SSE comments: it dropped, and
            # sent again, a stream whose prompt a CPU read for minutes
            return b"".join(self._start() if not self.sequence else [self._in_progress("response.in_progress")])
        if self.compacting:
            return self._summary(chunk)
        out = [] if self.sequence else self._start()
        if chunk.thinking:
            out += self._item("reasoning") + [self._event("response.reasoning_summary_text.delta", {
                **self._at(), "summary_index": 0, "delta": chunk.thinking})]
            self.pieces.append(chunk.thinking)
        if chunk.text:
            out += self._item("message") + [self._event("response.output_text.delta", {
                **self._at(), "content_index": 0, "delta": chunk.text, "logprobs": token_logprobs(chunk.logprobs)})]
            self.pieces.append(chunk.text)
            self.logprobs += chunk.logprobs
        if chunk.tool_calls:
            out += self._close()
            for call in chunk.tool_calls:
                out += self._call(call_item(call, self.parsed.names))
        if chunk.finish_reason is not None:
            out += self._end(status_of(chunk), chunk.usage, chunk.finish_reason)
        return b"".join(out)

    def _summary(self, chunk: Chunk) -> bytes:
        """A compaction's stream: `response.compaction.compacting` as the summary is written (no content, as OpenAI
        sends it), then the summary whole, as one compaction item (Codex takes exactly one, from
        `response.output_item.done`)."""
        out = [] if self.sequence else self._start()
        if chunk.text:
            self.pieces.append(chunk.text)
            out.append(self._event("response.compaction.compacting", {"item_id": self.compaction_id,
                                                                       "output_index": 0}))
        if chunk.finish_reason is None:
            return b"".join(out)
        try:
            item, self.pieces = compaction_item("".join(self.pieces), self.compaction_id), []
        except BackendError as e:
            return b"".join(out) + self.fail(e)
        out += [self._event("response.output_item.added", {"output_index": 0, "item": item}),
                self._event("response.output_item.done", {"output_index": 0, "item": item})]
        self.output.append(item)
        return b"".join(out + self._end(status_of(chunk), chunk.usage, chunk.finish_reason))

    def finish(self) -> bytes:
        """A stream that ended without a finish reason (never, when the backend behaves) still completes."""
        return b"" if self.final else b"".join(([] if self.sequence else self._start()) + self._end("completed", None))

    def fail(self, err: VeloError) -> bytes:
        """An error after the first event: the response fails, in its own stream, with what went wrong. An `error`
        event first, which the AI SDK and the openai package raise (the AI SDK drops `response.failed`, and gave an
        empty answer with no error on an overflow); Codex reads `response.failed` and passes over `error`. A failure
        after the answer ended (the pipeline's work after it) keeps that end, as a foreground stream does: a background
        one went on with `error` and `response.failed` after `response.completed`, and was stored failed."""
        if self.final is not None:
            return b""
        out = ([] if self.sequence else self._start()) + self._close("incomplete")  # it never got its end
        self.final = response_object(self.resp_id, self.parsed, self.created_at, "failed", self.output, error=err)
        error = error_object(err, "responses")["error"]
        error["code"] = error["code"] or error["type"]  # a string in the AI SDK's schema
        # OpenAI's event carries code, message and param at its top; the SDKs read them under `error`
        said = {k: error[k] for k in ("code", "message", "param")}
        return b"".join(out + [self._event("error", {**said, "error": error}),
                               self._event("response.failed", {"response": self.final})])

    def cancel(self, reason: VeloError | None) -> None:
        """A background response ended before its answer: "cancelled" when its client or an admin asked
        (`reason` None or a 499), with no event: its stream ends. Else it fails with the reason (Velo shutting
        down), in its stream too, as any failed response's: its followers read why, where the SDK's stream helper
        saw the stream end with no error. One whose answer had ended (the pipeline's work after it was cut) keeps
        that end, which its events already say."""
        if self.final is not None:
            return
        if reason is not None and reason.status != 499:
            self.fail(reason)
            return
        self._close("incomplete")
        self.final = response_object(self.resp_id, self.parsed, self.created_at, "cancelled", self.output)

    def snapshot(self, ended: bool = True) -> dict[str, Any]:
        """The response while it is written: queued until its first event, then in progress, with the items done;
        its end once `ended`."""
        if self.final is not None and ended:
            return self.final
        return response_object(self.resp_id, self.parsed, self.created_at, "in_progress" if self.sequence else "queued",
                               list(self.output))

    def _event(self, kind: str, body: dict[str, Any]) -> bytes:
        obj = {"type": kind, "sequence_number": self.sequence, **body}
        self.sequence += 1
        event = b"event: " + kind.encode() + b"\ndata: " + dumps(obj) + b"\n\n"
        if self.log is not None:
            self.log.append(event)
        return event

    def _at(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.output)}

    def _start(self) -> list[bytes]:
        return [self._in_progress("response.created"), self._in_progress("response.in_progress")]

    def _in_progress(self, kind: str) -> bytes:
        """`kind` with the response in progress and no output: at the start, and again as a heartbeat (the SDK's
        snapshot keeps its own output)."""
        return self._event(kind, {
            "response": response_object(self.resp_id, self.parsed, self.created_at, "in_progress", [])})

    def _item(self, kind: str) -> list[bytes]:
        if self.open is not None and self.open["type"] == kind:
            return []
        out = self._close()
        if kind == "reasoning":
            self.open = {"id": new_id("rs"), "type": "reasoning", "summary": []}
            part = {"summary_index": 0, "part": {"type": "summary_text", "text": ""}}
            following = ("response.reasoning_summary_part.added", part)
        else:
            self.open = message_item(new_id("msg"), "", "in_progress")
            part = {"content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}
            following = ("response.content_part.added", part)
        out.append(self._event("response.output_item.added", {"output_index": len(self.output), "item": self.open}))
        out.append(self._event(following[0], {**self._at(), **following[1]}))
        return out

    def _close(self, status: str = "completed") -> list[bytes]:
        """`status`: the message's, "incomplete" where the output limit cut it (as OpenAI marks it)."""
        if self.open is None:
            return []
        at, text = self._at(), "".join(self.pieces)
        if self.open["type"] == "reasoning":
            item = reasoning_item(self.open["id"], text, status)
            out = [self._event("response.reasoning_summary_text.done", {**at, "summary_index": 0, "text": text}),
                   self._event("response.reasoning_summary_part.done", {
                       **at, "summary_index": 0, "part": {"type": "summary_text", "text": text}})]
        else:
            item = message_item(self.open["id"], text, status, logprobs=self.logprobs)
            part = item["content"][0]
            out = [self._event("response.output_text.done", {**at, "content_index": 0, "text": text,
                                                             "logprobs": part["logprobs"]}),
                   self._event("response.content_part.done", {**at, "content_index": 0, "part": part})]
        out.append(self._event("response.output_item.done", {"output_index": at["output_index"], "item": item}))
        self.output.append(item)
        self.open, self.pieces, self.logprobs = None, [], []
        return out

    def _call(self, item: dict[str, Any]) -> list[bytes]:
        at = {"item_id": item["id"], "output_index": len(self.output)}
        custom = item["type"] == "custom_tool_call"
        field_, kind = ("input", "custom_tool_call_input") if custom else ("arguments", "function_call_arguments")
        added = {**item, field_: "", "status": "in_progress"}
        out = [self._event("response.output_item.added", {"output_index": at["output_index"], "item": added}),
               self._event(f"response.{kind}.delta", {**at, "delta": item[field_]}),
               self._event(f"response.{kind}.done", {**at, field_: item[field_], "name": item["name"]}),
               self._event("response.output_item.done", {"output_index": at["output_index"], "item": item})]
        self.output.append(item)
        return out

    def _end(self, status: str, usage: Usage | None, finish: FinishReason | None = None) -> list[bytes]:
        """An answer with no output at all ends with an empty message, as the whole answer has one (`output_items`)."""
        out = self._item("message") if not self.output and self.open is None else []
        out += self._close("incomplete" if status == "incomplete" else "completed")
        self.final = response_object(self.resp_id, self.parsed, self.created_at, status, self.output, usage,
                                     finish=finish)
        return out + [self._event("response.completed", {"response": self.final})]
