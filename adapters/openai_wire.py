"""The one place that converts Velo's internal types to and from the OpenAI wire format, for the adapters of
OpenAI-compatible servers (openai_compat) and llama-server (llamacpp).

Streamed tool calls arrive as argument-string fragments; `ChatStream` accumulates them and emits each call once,
complete, in the last chunk. Arguments that do not parse as a JSON object are NOT turned into a ToolCall: the
call is written into the text instead, as `{"name": NAME, "arguments": RAW}` (RAW verbatim), so the proxy's
tool-call repair sees what the model produced and can fix it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

import orjson

from . import options
from .errors import BackendError
from .exact_json import dumps, loads
from .fields import count, nests_deeper, reported, wire_text
from .protocol import (ChatRequest, Chunk, CompletionRequest, EmbedResult, FinishReason, Message, OutputFormat,
                       SamplingOptions, TokenLogprob, ToolCall, Usage)
from .tool_prompt import in_prompt

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "tool_calls": "tool_calls",
                                    "function_call": "tool_calls", "content_filter": "content_filter"}
# The server gave up on the request (vLLM's and SGLang's `abort`): a failure, never a whole answer to keep. Any
# other reason a server makes up is read as "stop".
_FAILED = frozenset({"abort", "error"})


def format_to_wire(fmt: OutputFormat) -> dict[str, Any] | None:
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    return None


def _content(m: Message) -> Any:
    if not m.images:
        return m.content
    return [{"type": "text", "text": m.content}] + [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{img}"}} for img in m.images]


def message_to_wire(m: Message, call_ids: list[str], tool_call_id: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": _content(m)}
    if m.tool_calls:
        out["tool_calls"] = [{"id": cid, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments_json()}}
                             for cid, c in zip(call_ids, m.tool_calls)]
    if m.role == "tool":
        out["tool_call_id"] = tool_call_id
        if m.tool_name:
            out["name"] = m.tool_name
    if m.thinking and m.role == "assistant":  # an earlier turn's reasoning, which a tool loop's next step reads
        # under both names: llama-server and SGLang read `reasoning_content`, vLLM since 0.16 only `reasoning`
        out["reasoning_content"] = out["reasoning"] = m.thinking
    return out


def messages_to_wire(messages: list[Message]) -> list[dict[str, Any]]:
    """Ollama-dialect histories carry no call ids: calls get `call_<msg>_<n>` and each tool answer the id of
    the oldest unanswered call with its `tool_name` (else the oldest unanswered), as OpenAI servers require."""
    out, open_calls = [], []  # (id, name) of calls not yet answered
    for n, m in enumerate(messages):
        ids = [c.id or f"call_{n}_{i}" for i, c in enumerate(m.tool_calls)]
        open_calls += [(cid, c.name) for cid, c in zip(ids, m.tool_calls)]
        answered = ""
        if m.role == "tool":
            answered = m.tool_call_id or next((cid for cid, name in open_calls if name == m.tool_name),
                                              open_calls[0][0] if open_calls else "call_0")
            open_calls = [c for c in open_calls if c[0] != answered]
        if m.role == "tool" and m.images:  # OpenAI's tool messages take text only: the images follow as a user turn
            out += [message_to_wire(replace(m, images=[]), ids, answered),
                    message_to_wire(Message("user", "The images the tool returned:", images=m.images), [])]
        else:
            out.append(message_to_wire(m, ids, answered))
    return out


def _with_common(body: dict[str, Any], sampling: SamplingOptions, fmt: OutputFormat, stream: bool,
                 n: int) -> dict[str, Any]:
    body.update(options.as_llama_reads(options.write("openai", sampling)), stream=stream)
    if stream:
        body["stream_options"] = {"include_usage": True}
    if (rf := format_to_wire(fmt)) is not None:
        body["response_format"] = rf
    if n != 1:
        body["n"] = n
    return body


def chat_to_wire(req: ChatRequest) -> dict[str, Any]:
    if req.tools_in_prompt:
        req = in_prompt(req)
    body: dict[str, Any] = {"model": req.model, "messages": messages_to_wire(req.messages)}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.parameters}} for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    if kwargs := req.template_variables:  # vLLM, SGLang and llama-server switch Qwen3-style templates
        body["chat_template_kwargs"] = kwargs
    if isinstance(req.think, str):  # a level is OpenAI's
        body["reasoning_effort"] = req.think
    if req.options.logprobs:  # at least one alternative: see `alternatives`
        body |= {"logprobs": True, "top_logprobs": req.options.top_logprobs or 1}
    return _with_common(body, req.options, req.format, req.stream, req.n)


def completion_to_wire(req: CompletionRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": req.model, "prompt": req.prompt if req.prompt_ids is None else req.prompt_ids}
    if req.suffix is not None:
        body["suffix"] = req.suffix
    if req.options.logprobs:
        body["logprobs"] = req.options.top_logprobs or 1
    return _with_common(body, req.options, req.format, req.stream, req.n)


def alternatives(stream: AsyncIterator[Chunk], o: SamplingOptions) -> AsyncIterator[Chunk]:
    """Each token's alternatives cut to the `top_logprobs` asked for. llama-server (itself, or behind an OpenAI
    backend) gives 20 where a request names no count, and no logprobs at all for a count of 0, so it is asked for at
    least one and the rest is cut here: OpenAI, Ollama and the engine give none unless asked."""
    return _cut_alternatives(stream, o.top_logprobs or 0) if o.logprobs else stream


async def _cut_alternatives(stream: AsyncIterator[Chunk], n: int) -> AsyncIterator[Chunk]:
    async with contextlib.aclosing(stream):
        async for chunk in stream:
            for lp in chunk.logprobs:
                del lp.top[n:]
            yield chunk


def usage_from_wire(usage: dict[str, Any] | None, timings: dict[str, Any] | None) -> Usage | None:
    """OpenAI `usage` (with `prompt_tokens_details.cached_tokens`, as vLLM and llama-server send it), plus
    llama-server's `timings` (milliseconds) as nanoseconds when present. They time the prompt and the answer only,
    not a wait for a free slot, so no total is made of them: Velo times it, as Ollama does, from arrival. Without
    `usage`, the prompt is what its slot kept (`cache_n`) and what it read after that (`prompt_n`), as Ollama adds
    them (llm/llama_server.go)."""
    if usage is None and timings is None:
        return None
    usage, timings = usage or {}, timings or {}
    details = usage.get("prompt_tokens_details") or {}
    out = Usage(prompt_tokens=count(usage, "prompt_tokens", count(timings, "prompt_n") + count(timings, "cache_n")),
                completion_tokens=count(usage, "completion_tokens", count(timings, "predicted_n")),
                cached_tokens=count(details, "cached_tokens") or count(timings, "cache_n"),
                prompt_eval_ns=int(reported(timings, "prompt_ms") * 1e6),
                eval_ns=int(reported(timings, "predicted_ms") * 1e6))
    return out


def logprobs_from_wire(lp: dict[str, Any] | None) -> list[TokenLogprob]:
    """Chat logprobs (`content: [{token, logprob, top_logprobs}]`); completions' parallel lists are read too."""
    if not lp:
        return []
    if lp.get("content") is not None:
        return [TokenLogprob.from_wire(t) for t in lp["content"]]
    tops = lp.get("top_logprobs") or [None] * len(lp.get("tokens") or [])
    return [TokenLogprob(tok, p, [TokenLogprob(t, q) for t, q in (top or {}).items()])
            for tok, p, top in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], tops)]


@dataclass
class _PendingCall:
    """A streamed call as its deltas come: the arguments' pieces kept apart and joined once at the end (`+=` on an
    attribute copies the whole string each time: 1 MB of arguments in 16-character deltas held the event loop 17 s)."""

    id: str = ""
    name: str = ""
    pieces: list[str] = field(default_factory=list)

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)


def complete_calls(calls: list[_PendingCall]) -> tuple[list[ToolCall], str]:
    """Parsed calls, and the raw text of those whose arguments are not a JSON object (see module docstring)."""
    done, raw = [], ""
    for c in calls:
        arguments = c.arguments
        try:
            args = loads(arguments or "{}")
        except orjson.JSONDecodeError:
            args = None
        if isinstance(args, dict) and not nests_deeper(args):
            done.append(ToolCall(name=c.name, arguments=args, id=c.id, text=arguments))
        else:
            raw += f'{{"name": {orjson.dumps(c.name).decode()}, "arguments": {arguments}}}'
    return done, raw


def _arguments_text(args: Any) -> str:
    """Some servers send arguments as an object although OpenAI specifies a string."""
    return wire_text(args) if args is None or isinstance(args, str) else dumps(args).decode()


def reconcile(finish: FinishReason, calls: list[ToolCall]) -> FinishReason:
    """"tool_calls" exactly when complete calls came out (servers differ; unparseable calls became text)."""
    if finish == "stop" and calls:
        return "tool_calls"
    return "stop" if finish == "tool_calls" and not calls else finish


def as_stream_event(answer: dict[str, Any]) -> dict[str, Any]:
    """A whole `chat.completion` / `text_completion` answer as the one stream event that says the same (its message
    as the delta, each tool call under its index), for ChatStream to fold as it folds a stream."""
    choices = []
    for choice in answer.get("choices") or []:
        message = choice.get("message") or {}
        calls = [{**call, "index": i} for i, call in enumerate(message.get("tool_calls") or [])]
        choices.append({**choice, "delta": {**message, "tool_calls": calls}})
    return {**answer, "choices": choices}


def _matched_stop(choice: dict[str, Any]) -> str | None:
    """The stop string that ended a choice, where the server says: vLLM's `stop_reason`, SGLang's `matched_stop`
    (each an integer for a stop token). llama-server says it in its debug field (`_stopping_word`); Ollama does not."""
    matched = choice.get("stop_reason", choice.get("matched_stop"))
    return matched if isinstance(matched, str) else None


def _stopping_word(event: dict[str, Any]) -> str | None:
    """llama-server's `__verbose.stopping_word`, asked for with `verbose` (adapters/llamacpp.py): on the final
    answer, or on the first event of a stream's last result, which need not be the one with its finish_reason."""
    verbose = event.get("__verbose")
    word = verbose.get("stopping_word") if isinstance(verbose, dict) else None
    return word if isinstance(word, str) and word else None


def _choice_zero(choices: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """Choice 0 of an event, looked for where it is not first in the list (it is on every server seen, which
    `ChatStream.feed` reads without this call)."""
    return next((c for c in choices or () if c.get("index", 0) == 0), None)


@dataclass
class ChatStream:
    """Folds `chat.completion.chunk` / `text_completion` stream events into Chunks (choice 0 only); or, `whole`, into
    the one answer `last` gives: its pieces kept here, not a Chunk made of each and folded by `aggregate` after two
    more generators (a short non-streamed chat's 2,178 -> 2,085 thousand instructions, bench/proxy_instructions.py)."""

    calls: dict[int, _PendingCall] = field(default_factory=dict)
    finish: FinishReason | None = None
    usage: Usage | None = None
    stop_sequence: str | None = None
    whole: bool = False
    texts: list[str] = field(default_factory=list)  # `whole`'s pieces, joined once in `last`
    thinkings: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def feed(self, event: dict[str, Any]) -> Chunk | None:
        """Called once per streamed token, so the common event (one choice, text only) takes the short way: a
        12-event answer's way through the adapter (read, parse, fold) went from 46 to 39 us."""
        if "usage" in event or "timings" in event:
            self.usage = usage_from_wire(event.get("usage"), event.get("timings")) or self.usage
        if "__verbose" in event:
            self.stop_sequence = _stopping_word(event) or self.stop_sequence
        choices = event.get("choices")  # choice 0 read in place: a 256-piece stream 22,851 -> 22,756 thousand
        choice = choices[0] if choices and choices[0].get("index", 0) == 0 else _choice_zero(choices)
        if choice is None:
            return None
        delta = choice.get("delta") or {}
        if "tool_calls" in delta:
            self._take_calls(delta["tool_calls"] or [])
        if reason := choice.get("finish_reason"):
            if reason in _FAILED:
                raise BackendError(f"the backend ended the answer with finish_reason {reason!r}")
            self.finish = _FINISH.get(reason, "stop")
            self.stop_sequence = _matched_stop(choice) or self.stop_sequence
        text = delta.get("content")
        if type(text) is not str or not text:  # the common piece, text, read without a call (0.3% of a stream)
            text = wire_text(text) or wire_text(choice.get("text"))
        # DeepSeek's name, llama-server's; vLLM's since 0.16 is `reasoning` (its 0.9-0.15 sent both). Looked for
        # first: two calls for each event without either were 0.6% of a short chat request (2,243 -> 2,229 thousand)
        thinking = wire_text(delta.get("reasoning_content")) or wire_text(delta.get("reasoning")) \
            if "reasoning_content" in delta or "reasoning" in delta else ""
        logprobs = logprobs_from_wire(choice["logprobs"]) if choice.get("logprobs") else []
        if not self.whole:
            return Chunk(text=text, thinking=thinking, logprobs=logprobs) if text or thinking or logprobs else None
        self.texts.append(text)
        self.thinkings.append(thinking)
        self.logprobs += logprobs
        return None

    def _take_calls(self, fragments: list[dict[str, Any]]) -> None:
        for frag in fragments:
            if not isinstance(index := frag.get("index") or 0, int):  # null as absent; else sorted with ints later
                raise TypeError(f"a tool call's index is not an integer: {index!r}")
            call = self.calls.setdefault(index, _PendingCall())
            call.id = wire_text(frag.get("id")) or call.id
            fn = frag.get("function") or {}
            call.name += wire_text(fn.get("name"))
            call.pieces.append(_arguments_text(fn.get("arguments")))

    def last(self) -> Chunk:
        """The closing chunk: complete tool calls (the raw text of those that are not, after the answer's own),
        finish reason and usage; `whole`, with all of the answer before it."""
        calls, raw = complete_calls([self.calls[i] for i in sorted(self.calls)])
        return Chunk(text="".join([*self.texts, raw]), thinking="".join(self.thinkings), logprobs=self.logprobs,
                     tool_calls=calls, finish_reason=reconcile(self.finish or "stop", calls), usage=self.usage,
                     stop_sequence=self.stop_sequence)


def embeddings_from_wire(obj: dict[str, Any]) -> EmbedResult:
    """An `/v1/embeddings` answer: its rows in `index` order, each a list of numbers."""
    rows = sorted(obj.get("data", []), key=lambda d: d.get("index", 0))
    embeddings = [r["embedding"] for r in rows]
    if not all(isinstance(e, list) for e in embeddings):
        raise TypeError("an embedding is not an array of numbers")
    return EmbedResult(embeddings=embeddings, prompt_tokens=count(obj.get("usage"), "prompt_tokens"))
