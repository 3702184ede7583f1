"""The Ollama native dialect: request bodies -> internal requests, internal chunks -> Ollama JSON objects.

Shapes follow Ollama's docs/api.md (see ../shared/PROTOCOLS.md): `stream` defaults to true, durations are
nanoseconds, tool-call arguments are JSON objects.
"""
from __future__ import annotations

import binascii
import re
import time
from datetime import datetime, timezone
from typing import Any

from adapters import keep_alive, options
from adapters.errors import BadRequest, ModelNotFound, UnusableFormat, VeloError
from adapters.protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, Message,
                               SamplingOptions, TokenLogprob, Tool, ToolCall, Usage)

from adapters.fields import body_object, get, get_model, string_list

from .ollama_names import go_quoted

_MAX_TOP_LOGPROBS = 20  # server/routes.go
# Ollama's options outside the sampling table (api/types.go Options and Runner) with the type its Options.FromMap
# takes, and mirostat, tfs_z and penalize_newline of older versions, which llama-server still honours and Ollama no
# longer reads (None: nothing to check): passed on in `extra`.
_OTHER_TYPES: dict[str, type | None] = {
    "num_keep": int, "num_batch": int, "num_gpu": int, "main_gpu": int, "use_mmap": bool, "num_thread": int,
    "draft_num_predict": int, "mirostat": None, "mirostat_tau": None, "mirostat_eta": None, "tfs_z": None,
    "penalize_newline": None}
OTHER_OPTIONS = frozenset(_OTHER_TYPES)
_OPTION_TYPES = options.kinds("ollama") | _OTHER_TYPES
_GO_TYPE_NAMES = {int: "integer", float: "float32", bool: "boolean", list: "array"}  # as FromMap names them


# Knobs a client puts beside `options`, as ollama-ai-provider-v2 does (Cherry Studio and other AI SDK apps): Ollama
# ignores them there, and the user's temperature and output limit went unheard. `options` wins where both say; a
# value that is no number is ignored there, as by Ollama, not a new 400.
_BESIDE_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "num_predict"}


def parse_options(body: dict[str, Any]) -> SamplingOptions:
    """The `options` object: knobs by the options table, anything else passed on untouched in `extra`."""
    beside = {name: value for key, name in _BESIDE_OPTIONS.items()
              if isinstance(value := body.get(key), (int, float)) and not isinstance(value, bool)}  # else ignored
    raw = beside | _typed_options(get(body, "options", dict, {}))
    opts = options.read("ollama", raw, cut_fractions=True)
    known = options.names("ollama")
    opts.extra = {k: v for k, v in raw.items() if k not in known}
    return opts  # num_predict -1 (until done) and -2 (fill the context) stay, for the fit stage


def _typed_options(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw`, once each option Ollama reads has its type, else Ollama's refusal in its words (api/types.go
    Options.FromMap, which every handler applies; Ollama answers 500, a client's mistake a 400 here): a number of
    either kind for an integer or a float, null unset. A string `stop` stays Velo's one stop word."""
    for key, value in raw.items():
        kind = _OPTION_TYPES.get(key)
        if kind is None or value is None or kind is list and isinstance(value, str):
            continue
        if not isinstance(value, kind if kind in (bool, list) else (int, float)) \
                or isinstance(value, bool) != (kind is bool):
            raise BadRequest(f"option {go_quoted(key)} must be of type {_GO_TYPE_NAMES[kind]}", param=key)
        if kind is list and not all(isinstance(v, str) for v in value):
            raise BadRequest(f"option {go_quoted(key)} must be of an array of strings", param=key)
    return raw


def parse_top_logprobs(body: dict[str, Any], key: str = "top_logprobs", most: int = _MAX_TOP_LOGPROBS) -> int:
    """`top_logprobs`: 0-20 alternatives per token (Ollama's bound and OpenAI's; OpenAI's completions call it
    `logprobs`, 0-5), a 400 in Ollama's words outside (a negative count failed in the engine with a 502)."""
    top = get(body, key, int, 0)
    if not 0 <= top <= most:
        raise BadRequest(f"{key} must be between 0 and {most}", param=key)
    return top


def _with_logprobs(opts: SamplingOptions, body: dict[str, Any]) -> SamplingOptions:
    """`logprobs` and `top_logprobs` (Ollama 0.12.11): top-level fields; `top_logprobs` alone asks for nothing."""
    top = parse_top_logprobs(body)
    opts.logprobs = get(body, "logprobs", bool, False)
    opts.top_logprobs = top if opts.logprobs and top else None
    return opts


def parse_format(body: dict[str, Any]) -> Any:
    fmt = body.get("format")
    if fmt in (None, ""):
        return None
    if fmt == "json" or isinstance(fmt, dict):
        return fmt
    raise BadRequest('format must be "json" or a JSON Schema object', param="format")


def _tool_call(raw: Any) -> ToolCall:
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest("tool_calls entries must be {function: {name, arguments}}", param="messages")
    args = fn.get("arguments")
    args = {} if args is None else args  # null is no arguments, as Go's JSON reads it (api/types.go orderedmap)
    if not isinstance(args, dict):
        raise BadRequest("tool call arguments must be an object", param="messages")
    called = raw.get("id")  # null is no id ("None" gave two calls one id, and the second's result the first's)
    return ToolCall(name=fn["name"], arguments=args, id="" if called is None else str(called))


def _images(body: dict[str, Any], param: str) -> list[str]:
    """Ollama's images are base64 (`[]byte` in Go's JSON): anything else is its 400, in its words, so a web URL is
    never fetched (it would let any client make Velo reach any address it names) nor passed on as an image."""
    images = get(body, "images", list, [])
    for image in images:
        if not isinstance(image, str):
            raise BadRequest("images must be base64 strings", param=param)
        try:
            lines = "\n" in image or "\r" in image  # Go skips both; copies of a few MB are not made for nothing
            binascii.a2b_base64(image.replace("\r", "").replace("\n", "") if lines else image, strict_mode=True)
        except ValueError:
            bad = _NOT_BASE64.search(image)
            raise BadRequest(f"illegal base64 data at input byte {bad.start() if bad else len(image)}",
                             param=param) from None
    return images


_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/=\r\n]")


def parse_message(raw: Any) -> Message:
    if not isinstance(raw, dict):
        raise BadRequest("messages must be objects", param="messages")
    role = get(raw, "role", str, required=True).lower()  # as Ollama reads it (api/types.go Message.UnmarshalJSON)
    return Message(role=role, content=get(raw, "content", str, ""), images=_images(raw, "messages"),
                   tool_calls=[_tool_call(c) for c in get(raw, "tool_calls", list, [])],
                   tool_name=get(raw, "tool_name", str, ""), tool_call_id=get(raw, "tool_call_id", str, ""),
                   thinking=get(raw, "thinking", str, ""))


def parse_tools(body: dict[str, Any]) -> list[Tool]:
    """Ollama and OpenAI share the tool declaration shape: {type: "function", function: {name, ...}}."""
    tools = []
    for raw in get(body, "tools", list, []):
        fn = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest("tools entries must be {type: 'function', function: {name, ...}}", param="tools")
        params = fn.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest("tool parameters must be a JSON Schema object", param="tools")
        tools.append(Tool(name=fn["name"], description=str(fn.get("description") or ""), parameters=params))
    return tools


def parse_think(body: dict[str, Any]) -> bool | str | None:
    """Ollama's `think`: true / false, or a level ("low", "medium", "high", and since 0.22 "max") for models that
    take one. "max" is "high", as Ollama itself sends it to gpt-oss and as the other dialects read it (EFFORTS in
    openai.py), so an older Ollama behind Velo never sees a level it refuses."""
    think = body.get("think")
    if think is None or isinstance(think, bool) or think in ("low", "medium", "high"):
        return think
    if think == "max":
        return "high"
    choices = '"high", "medium", "low", "max", true, or false'  # Ollama's words (api/types.go ThinkValue)
    if isinstance(think, str):
        raise BadRequest(f"invalid think value: {go_quoted(think)} (must be {choices})", param="think")
    raise BadRequest(f"think must be a boolean or string ({choices})", param="think")


def parse_keep_alive(body: dict[str, Any]) -> Any:
    """The client's value as sent (an Ollama backend gets it untouched), once checked as Ollama checks it."""
    value = body.get("keep_alive")
    keep_alive.seconds(value)
    return value


def _shared(body: dict[str, Any]) -> dict[str, Any]:
    """The generation fields /api/chat and /api/generate share (api/types.go's ChatRequest and GenerateRequest).
    Only `think: false` leaves a <think> block in the text: unset is on for a model that thinks (server/routes.go)."""
    think = parse_think(body)
    return {"options": _with_logprobs(parse_options(body), body), "format": parse_format(body),
            "stream": get(body, "stream", bool, True), "keep_alive": parse_keep_alive(body),
            "think": think, "splits_thinking": think is not False, "truncate": get(body, "truncate", bool),
            "shift": get(body, "shift", bool)}


def parse_chat(body: Any) -> ChatRequest:
    body = body_object(body)
    messages = [parse_message(m) for m in get(body, "messages", list, [])]
    if len(messages) > 1 and messages[-1].empty_assistant:  # Ollama's templates leave the last assistant turn
        messages.pop()  # open: an empty one prompts as without it; passed on, a template closed it and opened another
    return ChatRequest(model=get_model(body), messages=messages, **_shared(body), tools=parse_tools(body))


def _generated_model(body: dict[str, Any], embeds: bool = False) -> str:
    """GenerateHandler and EmbedHandler answer a missing or blank model as a model they cannot find (server/routes.go:
    404 `model '' not found`, EmbedHandler's through handleScheduleError), where ChatHandler says 400 "model is
    required"."""
    model = get(body, "model", str, "")
    if not model.strip():
        raise not_pulled(model) if embeds else ModelNotFound(model)
    return get_model(body)


def not_pulled(model: str) -> ModelNotFound:
    """handleScheduleError's 404 (server/routes.go), which the embedding handlers answer for a model they cannot
    find, where the chat, generate and show handlers say `model 'x' not found`: embedding clients match on "try
    pulling it first" to tell the user to pull."""
    return ModelNotFound(model, f"model {go_quoted(model)} not found, try pulling it first")


def parse_generate(body: Any) -> CompletionRequest:
    body = body_object(body)
    context = get(body, "context", list)
    if context is not None and not all(isinstance(t, int) for t in context):
        raise BadRequest("context must be an array of integers", param="context")
    model = _generated_model(body)  # before the raw check, as Ollama looks for the model first
    if get(body, "raw", bool, False) and (body.get("template") or body.get("system") or context):
        raise BadRequest("raw mode does not support template, system, or context", param="raw")  # Ollama's words
    return CompletionRequest(
        # "" is no suffix, system or template, as Ollama reads them: its CLI sends all three empty with every prompt
        model=model, prompt=get(body, "prompt", str, ""), suffix=get(body, "suffix", str) or None,
        system=get(body, "system", str) or None, template=get(body, "template", str) or None,
        raw=get(body, "raw", bool, False),
        images=_images(body, "images"), context=context, **_shared(body))


def parse_embed(body: Any) -> EmbedRequest:
    body = body_object(body)
    inputs = [] if body.get("input") == "" else string_list(body, "input")  # Ollama embeds no empty string
    dimensions = get(body, "dimensions", int)  # Ollama shortens only by a positive count (server/routes.go)
    return EmbedRequest(model=_generated_model(body, embeds=True), inputs=inputs,
                        truncate=get(body, "truncate", bool, True),
                        dimensions=dimensions if dimensions and dimensions > 0 else None,
                        options=_typed_options(get(body, "options", dict, {})),
                        keep_alive=parse_keep_alive(body))


def parse_legacy_embeddings(body: Any) -> EmbedRequest:
    body = body_object(body)
    return EmbedRequest(model=get_model(body), inputs=[get(body, "prompt", str, "")],
                        options=_typed_options(get(body, "options", dict, {})), keep_alive=parse_keep_alive(body),
                        normalize=False)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _timings(usage: Usage | None, started_ns: int) -> dict[str, Any]:
    """Ollama's Metrics of a chat or generation."""
    u = usage or Usage()
    return _figures(started_ns, load_duration=u.load_ns, prompt_eval_count=u.prompt_tokens,
                    prompt_eval_duration=u.prompt_eval_ns, eval_count=u.completion_tokens, eval_duration=u.eval_ns)


def _figures(started_ns: int, **figures: int) -> dict[str, int]:
    """Ollama's figures, each `omitempty` (api/types.go Metrics, EmbedResponse): one the backend did not report (0)
    is left out, never sent as 0. The total is Velo's clock from the request's arrival, as Ollama's is from its
    handler's start (server/routes.go), queueing and loading included."""
    measured = {"total_duration": time.perf_counter_ns() - started_ns, **figures}
    return {name: value for name, value in measured.items() if value}


def _done_reason(chunk: Chunk) -> str:
    return "length" if chunk.finish_reason == "length" else "stop"


def _tool_call_out(index: int, call: ToolCall) -> dict[str, Any]:
    """api/types.go's ToolCall: `index` always sent, and the call's `id` (server/routes.go gives every call one),
    which a tool message's `tool_call_id` answers."""
    fn = {"function": {"index": index, "name": call.name, "arguments": call.arguments}}
    return {"id": call.id, **fn} if call.id else fn


def chat_object(model: str, chunk: Chunk, started_ns: int, calls_sent: int = 0) -> dict[str, Any]:
    """One NDJSON line of /api/chat (or the whole answer when `chunk` is the aggregate). `calls_sent`: tool calls
    the stream's earlier lines carried, since `index` counts on through a stream (tools/tools.go)."""
    message: dict[str, Any] = {"role": "assistant", "content": chunk.text}
    if chunk.thinking:
        message["thinking"] = chunk.thinking
    if chunk.tool_calls:
        message["tool_calls"] = [_tool_call_out(i, c) for i, c in enumerate(chunk.tool_calls, calls_sent)]
    out: dict[str, Any] = {"model": model, "created_at": now_iso(), "message": message,
                           "done": chunk.finish_reason is not None}
    _add_logprobs(out, chunk)
    if out["done"]:
        out["done_reason"] = _done_reason(chunk)
        out.update(_timings(chunk.usage, started_ns))
    return out


def _add_logprobs(out: dict[str, Any], chunk: Chunk) -> None:
    """The chunk's tokens as Ollama's server/logprob.go writes them: `bytes` as integers, `top_logprobs` only when
    asked for."""
    if chunk.logprobs:
        out["logprobs"] = [{**_token(lp), **({"top_logprobs": [_token(t) for t in lp.top]} if lp.top else {})}
                           for lp in chunk.logprobs]


def _token(lp: TokenLogprob) -> dict[str, Any]:
    out: dict[str, Any] = {"token": lp.token, "logprob": lp.logprob}
    if raw := lp.utf8:  # Go's omitempty
        out["bytes"] = raw
    return out


def generate_object(model: str, chunk: Chunk, started_ns: int) -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "created_at": now_iso(), "response": chunk.text,
                           "done": chunk.finish_reason is not None}
    if chunk.thinking:
        out["thinking"] = chunk.thinking
    _add_logprobs(out, chunk)
    if out["done"]:
        out["done_reason"] = _done_reason(chunk)
        if chunk.context is not None:
            out["context"] = chunk.context
        out.update(_timings(chunk.usage, started_ns))
    return out


def load_object(model: str, reason: str, load_ns: int = 0) -> dict[str, Any]:
    """/api/generate with an empty prompt only loads (or, with keep_alive 0, unloads) the model."""
    out = {"model": model, "created_at": now_iso(), "response": "", "done": True, "done_reason": reason}
    return out | ({"load_duration": load_ns, "total_duration": load_ns} if load_ns else {})


def chat_load_object(model: str, reason: str, load_ns: int = 0) -> dict[str, Any]:
    """/api/chat with no messages: the same, in a chat answer's shape."""
    out = {"model": model, "created_at": now_iso(), "message": {"role": "assistant", "content": ""}, "done": True,
           "done_reason": reason}
    return out | ({"load_duration": load_ns, "total_duration": load_ns} if load_ns else {})


def embed_object(model: str, result: EmbedResult, started_ns: int) -> dict[str, Any]:
    """Ollama's EmbedResponse (server/routes.go EmbedHandler)."""
    return {"model": model, "embeddings": result.embeddings,
            **_figures(started_ns, load_duration=result.load_ns,
                       prompt_eval_count=result.prompt_tokens)}


def error_object(err: VeloError) -> dict[str, Any]:
    """Ollama's `{"error": ...}`, with no `param`: a format no output can match is named in Ollama's words for it,
    which clients look for."""
    unusable = isinstance(err, UnusableFormat)
    return {"error": f"invalid JSON schema in format: {err.message}" if unusable else err.message}
