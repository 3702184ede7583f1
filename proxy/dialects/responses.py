"""The OpenAI Responses dialect: request bodies -> internal requests, internal chunks -> response objects and their
event stream.

Shapes follow OpenAI's API reference as the `openai` SDK's `types/responses/` model them, and what Codex was
captured sending (../shared/PROTOCOLS.md): the system prompt as a `developer` item, `store: false` with the whole
history resent, `reasoning` items echoed back, `namespace` tool groups (offered to the model as
`namespace.member`, as Ollama does, and answered as a call with `name` and `namespace`), `custom` freeform tools
(offered as a function taking `{"input": string}`, answered as a `custom_tool_call`). Thinking goes out as a
`reasoning` item whose summary, content and `encrypted_content` carry the text, so a client that echoes the item
back gives the model its thinking again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import orjson

from adapters import options
from adapters.errors import BackendError, BadRequest, NotFound, Overloaded, VeloError
from adapters.exact_json import loads
from adapters.fields import body_object, get, get_model, string_list
from adapters.protocol import (ChatRequest, Chunk, FinishReason, Message, SamplingOptions, TokenLogprob, Tool, ToolCall,
                               Usage)

from . import documents, new_id, tool_choice
from .ollama import parse_top_logprobs
from .openai import data_url_image, effort_level, error_object, token_logprobs
from .paging import query_int, window


FREEFORM = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
_UNHELD = {"conversation": "Velo keeps no conversations; send the history in `input` or continue with "
                            "`previous_response_id`",
           "prompt": "Velo keeps no stored prompts; send the prompt's text as `instructions`"}
_LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for them
_CALL_OUTPUTS = ("function_call_output", "custom_tool_call_output")  # input items answering a call
# echoed as sent, or null; checked first, as typed clients read them back (as strings, a number)
_ECHOED = {"prompt_cache_key": str, "prompt_cache_retention": str, "safety_identifier": str, "max_tool_calls": int,
           "user": str}


class ItemNotFound(NotFound):
    """OpenAI's 404 for an `item_reference` to an item it does not hold, in its words."""

    def __init__(self, item_id: str):
        super().__init__(f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to false. "
                         "Try again with `store` set to true, or remove this item from your input.", param="input")


class PreviousResponseNotFound(BadRequest):
    """OpenAI's 400 (not a 404) with its own code, on which Codex and proxies before it start the chain afresh."""

    code = "previous_response_not_found"

    def __init__(self, resp_id: str):
        super().__init__(f"Previous response with id '{resp_id}' not found.", param="previous_response_id")


class MissingInput(BadRequest):
    """OpenAI's 400 for a turn that nothing gives a conversation (no `input`, no `previous_response_id`): the model
    answered an empty conversation."""

    code = "missing_required_parameter"

    def __init__(self) -> None:
        super().__init__("Missing required parameter: 'input'.", param="input")


@dataclass(frozen=True)
class ToolName:
    """How an internal tool name reads on the wire: a namespace member, or a custom (freeform) tool."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass
class Parsed:
    """A Responses request: the items it adds to the conversation, and what the response object echoes."""

    model: str
    items: list[dict[str, Any]]
    instructions: str | None
    tools: list[Tool]
    names: dict[str, ToolName]  # internal tool name -> wire name, for tools that are not plain functions
    ignored_tools: list[str]
    tool_choice: Any
    format: Any
    think: bool | str | None
    sampling: Any
    stream: bool
    store: bool
    previous_response_id: str | None
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the response object repeats
    compact: bool = False  # the input ended with a compaction_trigger: the answer is one compaction item
    parallel_tool_calls: bool = True
    truncate: bool = False  # `truncation: "auto"`: drop the oldest turns that do not fit rather than a 400

    def chat(self, history: list[dict[str, Any]]) -> ChatRequest:
        """The internal request for this turn after `history` (the stored conversation, for previous_response_id)."""
        system = [Message("system", self.instructions)] if self.instructions else []
        return ChatRequest(model=self.model, messages=system + items_to_messages(history + self.items),
                           options=self.sampling, tools=self.tools, tool_choice=self.tool_choice,
                           format=self.format, stream=self.stream, think=self.think,
                           parallel_tool_calls=self.parallel_tool_calls, truncate=self.truncate or None)

    def summary(self, history: list[dict[str, Any]]) -> ChatRequest:
        """The internal request that compacts this conversation: the conversation, then the ask for its summary, with
        no tools to call and no thinking to spend the answer on, its oldest turns dropped where it does not fit (a
        conversation too long for the model is what compaction is for). Where the client set none: greedy, a repeat
        penalty (greedy SmolLM2-135M repeated one phrase to the cap, with 1.1 it stopped after 278 tokens) and an
        output limit (a summary as long as the conversation would compact nothing)."""
        req = self.chat(history)
        o = req.options
        sampling = replace(o, temperature=0.0 if o.temperature is None else o.temperature,
                           repeat_penalty=o.repeat_penalty or 1.1, max_tokens=o.max_tokens or _SUMMARY_TOKENS)
        return replace(req, messages=req.messages + [Message("user", SUMMARIZE)], tools=[], tool_choice=None,
                       format=None, think=False, options=sampling, truncate=True)


_DEFAULTS = options.defaults("responses")  # what the echo shows for a knob the request leaves unset


def parse_request(body: Any, *, counting: bool = False) -> Parsed:
    body = body_object(body)
    raw_tools = get(body, "tools", list, [])
    tools, names, ignored = _tools(raw_tools)
    tool_choice.named_apart(tools)  # a namespace's members by their qualified names, which a function's may take
    hosted = {t["type"] for t in raw_tools} - _OWN_TOOLS  # each an object with a type (`_tools`)
    tools, choice = _tool_choice(body.get("tool_choice"), tools, hosted)
    reasoning = get(body, "reasoning", dict, {})
    text = get(body, "text", dict, {})
    sampling = _with_logprobs(options.read("responses", body), body)
    if sampling.max_tokens is not None and sampling.max_tokens < 1:
        raise BadRequest("max_output_tokens: must be at least 1", param="max_output_tokens")
    echo = _echo(body, sampling, text, reasoning)
    if echo["truncation"] not in ("auto", "disabled"):
        raise BadRequest("truncation: must be 'auto' or 'disabled'", param="truncation")
    if echo["text"]["verbosity"] not in ("low", "medium", "high"):
        raise BadRequest("text.verbosity: must be 'low', 'medium' or 'high'", param="verbosity")
    _check_input(body, counting)
    items = _items(body.get("input"))
    compact = bool(items) and items[-1].get("type") == TRIGGER
    return Parsed(model=get_model(body), items=items[:-1] if compact else items,
                  instructions=get(body, "instructions", str), tools=tools, names=names, ignored_tools=ignored,
                  tool_choice=tool_choice.checked(choice, tools, ignored), format=_format(text.get("format")),
                  think=effort_level(reasoning.get("effort"), "reasoning.effort:", "reasoning"), sampling=sampling,
                  stream=get(body, "stream", bool, False), store=echo["store"],
                  previous_response_id=get(body, "previous_response_id", str), echo=echo,
                  compact=compact, parallel_tool_calls=echo["parallel_tool_calls"],
                  truncate=echo["truncation"] == "auto")


def _echo(body: dict[str, Any], sampling: SamplingOptions, text: dict[str, Any],
          reasoning: dict[str, Any]) -> dict[str, Any]:
    """The request's settings as the response object echoes them, OpenAI's defaults where it leaves one unset."""
    return {"instructions": body.get("instructions"), "max_output_tokens": sampling.max_tokens,
            "temperature": _DEFAULTS.temperature if sampling.temperature is None else sampling.temperature,
            "top_p": _DEFAULTS.top_p if sampling.top_p is None else sampling.top_p,
            "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
            "parallel_tool_calls": get(body, "parallel_tool_calls", bool, True),
            "text": {"format": text.get("format") or {"type": "text"},
                     "verbosity": get(text, "verbosity", str, "medium")},
            "reasoning": {"effort": reasoning.get("effort"), "summary": get(reasoning, "summary", str)},
            "truncation": get(body, "truncation", str, "disabled"), "metadata": _metadata(body),
            "previous_response_id": body.get("previous_response_id"),
            "store": get(body, "store", bool, True), "top_logprobs": parse_top_logprobs(body),
            "background": get(body, "background", bool, False), "service_tier": "default",  # the one tier here
            **{key: get(body, key, kind) for key, kind in _ECHOED.items()}}


def _check_input(body: dict[str, Any], counting: bool) -> None:
    """OpenAI's 400s for a conversation Velo does not hold, and for no input where no earlier response carries one."""
    for unheld in ("conversation", "prompt"):  # answering without them would answer another question
        if body.get(unheld) is not None:
            raise BadRequest(f"{unheld}: {_UNHELD[unheld]}", param=unheld)
    if body.get("previous_response_id") is None and not counting:  # `input_tokens` counts instructions and tools
        if body.get("input") is None:
            raise MissingInput()
        if body["input"] == []:  # the same empty conversation (pydantic-ai sends a blank message so OpenAI takes it)
            raise BadRequest("input must not be an empty array unless previous_response_id carries the conversation",
                             param="input")


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    """OpenAI's bounds (16 pairs, keys to 64 characters, string values to 512), its 400 past them: the response echoes
    `metadata`, and a list or a number went back as sent where typed clients read an object of strings."""
    metadata = get(body, "metadata", dict, {})
    if len(metadata) > 16 or not all(isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                                     for k, v in metadata.items()):
        raise BadRequest("metadata: at most 16 pairs, each a key of at most 64 characters and a string value of at "
                         "most 512", param="metadata")
    return metadata


def _with_logprobs(sampling: SamplingOptions, body: dict[str, Any]) -> SamplingOptions:
    """Log-probabilities come with the message text when `include` names `message.output_text.logprobs`;
    `top_logprobs` (0-20) adds the alternatives."""
    top = parse_top_logprobs(body)
    sampling.logprobs = _LOGPROBS in string_list(body, "include")
    sampling.top_logprobs = top if sampling.logprobs and top else None
    return sampling


def _items(raw: Any) -> list[dict[str, Any]]:
    """`input` as a list of items (a string is one user message)."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]}]
    if not isinstance(raw, list) or not all(isinstance(i, dict) for i in raw):
        raise BadRequest("input: must be a string or an array of items", param="input")
    for n, item in enumerate(raw):
        if item.get("id") is not None and not isinstance(item["id"], str):  # kept, and listed back, as the id
            raise BadRequest(f"input.{n}.id: must be a string", param="input")
    return [{"type": "message", **i} if "type" not in i and "role" in i else i for i in raw]


def items_to_messages(items: list[dict[str, Any]]) -> list[Message]:
    """Input and output items as internal messages: function calls join the assistant turn before them, a reasoning
    item's text becomes the next assistant turn's thinking, outputs become "tool" messages. A compaction item stands
    for the turns before it: of those only the user's and system messages stay, as `/v1/responses/compact` answers
    them, so a conversation continued from a stored compaction (`previous_response_id`) shrinks as Codex's does."""
    out: list[Message] = []
    names: dict[str, str] = {}  # call id -> tool name
    thinking = ""
    for n, item in enumerate(items):
        kind, where = item.get("type"), f"input.{n}"
        if kind == "message":
            message = _message(item, where)
            if message.role == "assistant":
                message.thinking, thinking = thinking, ""
            out.append(message)
        elif kind in ("function_call", "custom_tool_call"):
            call = _call(item, where)
            names[call.id] = call.name
            if out and out[-1].role == "assistant":
                out[-1].tool_calls.append(call)
            else:
                out.append(Message("assistant", thinking=thinking, tool_calls=[call]))
                thinking = ""
        elif kind in _CALL_OUTPUTS:
            call_id = get(item, "call_id", str, required=True)
            text, images = _output(item.get("output"), where)
            out.append(Message("tool", text, images=images, tool_call_id=call_id, tool_name=names.get(call_id, "")))
        elif kind == "reasoning":
            thinking += _reasoning_text(item)
        elif kind == "compaction":
            out = [m for m in out if m.role in ("user", "system")] + [Message("user", _compacted(item, where))]
            thinking = ""
        elif kind == TRIGGER:
            raise BadRequest(f"{where}: {TRIGGER} must be the last input item", param="input")
        else:
            raise BadRequest(f"{where}: input items of type {kind!r} are not supported", param="input")
    return out


# Compaction (Codex's remote compaction, v1 `POST /v1/responses/compact` and v2 a trailing `compaction_trigger`): the
# answer is one `compaction` item that Codex keeps in place of the history and sends back. Its `encrypted_content`
# is sealed (`_sealed`): the summary, read back as a user turn.
TRIGGER = "compaction_trigger"
_SUMMARY_TOKENS = 1024  # ~750 words: a handoff summary, a small part of any context it is meant to free
SUMMARIZE = ("Compact the conversation above so that it can go on in a fresh context. Write a summary for whoever "
             "continues it: the goal, what was decided and done (files changed, commands run and what they gave), "
             "what failed, what is still open, and the next step. Keep names, paths and numbers exact. Write only "
             "the summary.")
COMPACTED = "The conversation so far was compacted to fit the context. Its summary:\n\n"


def compaction_item(summary: str, item_id: str | None = None) -> dict[str, Any]:
    """The item for the model's summary; a model that wrote none failed the compaction (a 502: not the client's)."""
    if not summary.strip():
        raise BackendError("the model wrote no summary of the conversation")
    return {"id": item_id or new_id("cmp"), "type": "compaction",
            "encrypted_content": _sealed("compaction", summary=summary.strip())}


def user_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user's messages among `items`: what `POST /v1/responses/compact` answers before its compaction item, each
    with the id and status an output message has (they went out as sent, without them)."""
    return [stored_item(i) for i in items if i.get("type") == "message" and i.get("role") == "user"]


def _compacted(item: dict[str, Any], where: str) -> str:
    payload = _unsealed(get(item, "encrypted_content", str, required=True), "compaction")
    if payload is None or not isinstance(payload.get("summary"), str):
        raise BadRequest(f"{where}: a compaction item that Velo did not make (its encrypted_content is another "
                         "server's); compact the conversation again through Velo", param="input")
    return COMPACTED + payload["summary"]


def _message(item: dict[str, Any], where: str) -> Message:
    role = get(item, "role", str, required=True)
    if role not in ("user", "assistant", "system", "developer"):
        raise BadRequest(f"{where}.role: must be user, assistant, system or developer", param="input")
    message = Message("system" if role == "developer" else role)
    content = item.get("content")
    if isinstance(content, str):
        message.content = content
        return message
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: must be a string or an array of parts", param="input")
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "summary_text"):
            message.content += get(part, "text", str, "")
        elif kind == "input_image":
            message.images.append(_image(part, f"{where}.content.{i}"))
        elif kind == "input_file":
            message.content += documents.apart(message.content) + documents.openai_file(part, f"{where}.content.{i}",
                                                                                         "input")
        elif kind != "refusal":
            raise BadRequest(f"{where}.content.{i}: parts of type {kind!r} are not supported", param="input")
    return message


def _image(part: dict[str, Any], where: str) -> str:
    return data_url_image(part.get("image_url"), f"{where}.image_url", "input")


def _call(item: dict[str, Any], where: str) -> ToolCall:
    """A function call item with its `arguments` string as the call's `text`: the backend reads the call as the model
    wrote it, not re-spelled (which missed its prefix cache from that turn on)."""
    name = get(item, "name", str, required=True)
    if item.get("namespace"):
        name = f"{item['namespace']}.{name}"
    call_id = get(item, "call_id", str, required=True)
    if item["type"] == "custom_tool_call":
        return ToolCall(name, {"input": get(item, "input", str, "")}, call_id)
    arguments = get(item, "arguments", str, "{}")
    try:
        parsed = loads(arguments or "{}")
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"{where}.arguments: not valid JSON ({e})", param="input") from e
    if not isinstance(parsed, dict):
        raise BadRequest(f"{where}.arguments: must encode a JSON object", param="input")
    return ToolCall(name, parsed, call_id, arguments)


def _output(output: Any, where: str) -> tuple[str, list[str]]:
    """A tool's output: its text, its files' (documents.py) and its images (Codex's view_image answers with an
    `input_image` part)."""
    if isinstance(output, str):
        return output, []
    if not isinstance(output, list):
        raise BadRequest(f"{where}.output: must be a string or an array of parts", param="input")
    parts = [(i, p) for i, p in enumerate(output) if isinstance(p, dict)]
    text = ""
    for i, p in parts:
        if p.get("type") in ("input_text", "output_text", "text"):
            text += get(p, "text", str, "")
        elif p.get("type") == "input_file":
            text += documents.apart(text) + documents.openai_file(p, f"{where}.output.{i}", "input")
    return text, [_image(p, f"{where}.output.{i}") for i, p in parts if p.get("type") == "input_image"]


def _reasoning_text(item: dict[str, Any]) -> str:
    """The item's text; with none shown, what Velo sealed in `encrypted_content` (OpenAI's own is opaque there: an
    item from it with an empty summary gives the model no thinking, never the blob)."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise BadRequest("a reasoning item's content and summary must be arrays of parts", param="input")
    text = "".join(get(p, "text", str, "") for p in parts if isinstance(p, dict))
    payload = None if text else _unsealed(item.get("encrypted_content"), "reasoning")
    return text or str((payload or {}).get("text", ""))


def _sealed(kind: str, **fields: str) -> str:
    """Velo's `encrypted_content`: its own JSON, not encrypted (Ollama does the same), tagged so that another
    server's opaque content is never read as text."""
    return orjson.dumps({"type": f"velo_{kind}", "version": 1, **fields}).decode()


def _unsealed(content: Any, kind: str) -> dict[str, Any] | None:
    """What `_sealed` put in a `kind` item's content, or None for content Velo did not make."""
    try:
        payload = orjson.loads(content) if isinstance(content, str) else None
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) and payload.get("type") == f"velo_{kind}" else None


_OWN_TOOLS = {"function", "custom", "namespace"}  # tool types the model is offered; any other is a hosted tool


def _tools(raw: list[Any]) -> tuple[list[Tool], dict[str, ToolName], list[str]]:
    tools, names, ignored = [], {}, []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise BadRequest(f"tools.{i}: must be an object", param="tools")
        kind = tool.get("type")
        if not isinstance(kind, str):  # taken for a hosted tool, it was left out: the model answered without it
            raise BadRequest(f"tools.{i}.type: required, a string (function, custom, namespace or a hosted tool's)",
                             param="tools")
        if kind == "namespace":
            members, member_names, member_ignored = _tools(get(tool, "tools", list, []))
            prefix = get(tool, "name", str, required=True)
            for t in members:
                qualified = f"{prefix}.{t.name}"
                names[qualified] = ToolName(t.name, prefix, member_names.get(t.name, ToolName(t.name)).custom)
                tools.append(Tool(qualified, t.description, t.parameters))
            ignored += member_ignored
        elif kind == "function":
            tools.append(Tool(get(tool, "name", str, required=True), get(tool, "description", str, ""),
                              get(tool, "parameters", dict, {}) or {"type": "object", "properties": {}}))
        elif kind == "custom":
            name = get(tool, "name", str, required=True)
            names[name] = ToolName(name, custom=True)
            tools.append(Tool(name, _freeform_description(tool), FREEFORM))
        else:  # hosted tools (web_search, file_search, mcp, ...) run on OpenAI's side
            ignored.append(str(tool.get("name") or kind))
    return tools, names, ignored


def _freeform_description(tool: dict[str, Any]) -> str:
    """A custom tool takes free text; its grammar (if any) is what the text must follow."""
    fmt = get(tool, "format", dict, {})  # a string there, or a description that is no string, was a 500
    grammar = f"\nThe input must follow this {fmt.get('syntax', '')} grammar:\n{fmt['definition']}" \
        if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str) else ""
    return get(tool, "description", str, "") + grammar


def _tool_choice(raw: Any, tools: list[Tool], hosted: set[str]) -> tuple[list[Tool], Any]:
    """Internal form: None (auto), "none", "required", {"type": "function", "function": {"name"}}; an
    `allowed_tools` choice narrows the tools offered. A built-in tool's choice (`{"type": "web_search_preview"}`,
    `{"type": "mcp", ...}`) for a `hosted` tool that was given is auto: that tool runs on OpenAI's side and is left
    out here, so the model answers without it, as tool_choice.checked answers a forced hosted tool (it was a 400)."""
    if raw in (None, "auto"):
        return tools, None
    if raw in ("none", "required"):
        return tools, raw
    kind = raw.get("type") if isinstance(raw, dict) else None
    if isinstance(kind, str) and kind in hosted:
        return tools, None
    if kind in ("function", "custom"):
        return tools, {"type": "function", "function": {"name": get(raw, "name", str, required=True)}}
    if kind == "allowed_tools":
        allowed = {get(t, "name", str) for t in get(raw, "tools", list, []) if isinstance(t, dict)}  # a list: a 500
        return tool_choice.allowed(tools, allowed, raw.get("mode"))
    raise BadRequest("tool_choice: must be auto, none, required, or {type: function, name}", param="tool_choice")


def _format(fmt: Any) -> Any:
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return "json"
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return fmt["schema"]
    raise BadRequest("text.format: must be {type: text | json_object | json_schema, ...}", param="text")


# -- answers -------------------------------------------------------------------------------------------------------

def usage_object(usage: Usage | None) -> dict[str, Any]:
    u = usage or Usage()
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def response_object(resp_id: str, parsed: Parsed, created_at: float, status: str, output: list[dict[str, Any]],
                    usage: Usage | None = None, error: VeloError | None = None,
                    finish: FinishReason | None = None) -> dict[str, Any]:
    """`finish`: the answer's finish reason, which says why an incomplete one is (its output limit by default). A
    response not yet ended, queued as in progress, has no usage yet (null, as OpenAI's): a queued one said 0 tokens."""
    incomplete = None if status != "incomplete" else {"reason": _INCOMPLETE.get(finish or "length",
                                                                                "max_output_tokens")}
    return {"id": resp_id, "object": "response", "created_at": int(created_at), "status": status,
            "error": error_body(error) if error else None, "incomplete_details": incomplete, "model": parsed.model,
            "output": output, "usage": None if status in ("queued", "in_progress") else usage_object(usage),
            **parsed.echo, "completed_at": int(time.time()) if status == "completed" else None}


def error_body(err: VeloError) -> dict[str, Any]:
    """A failed response's `error`, worded as the dialect's HTTP error is (a context overflow as OpenAI words it),
    with one of the codes OpenAI gives a failed response (the SDKs' `ResponseError.code`), where it had Velo's own
    (`backend_error`, `timeout_error`, ...); a context overflow keeps OpenAI's `context_length_exceeded`, which Codex
    reads."""
    if err.code == "context_length_exceeded":
        code = err.code
    elif isinstance(err, Overloaded):
        code = "rate_limit_exceeded"
    else:
        code = "invalid_prompt" if err.status < 500 else "server_error"
    return {"code": code, "message": error_object(err, "responses")["error"]["message"]}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}],
            "content": [{"type": "reasoning_text", "text": text}], "encrypted_content": _sealed("reasoning", text=text),
            "status": status}


def message_item(item_id: str, text: str, status: str = "completed",
                 logprobs: list[TokenLogprob] | None = None) -> dict[str, Any]:
    """A finished message has its text part even when the text is empty, as OpenAI's and Ollama's do
    (openai/responses.go): clients read `content[0].text`. One just opened in a stream has none yet."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": token_logprobs(logprobs or [])}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [] if status == "in_progress" else [part]}


def call_item(call: ToolCall, names: dict[str, ToolName]) -> dict[str, Any]:
    wire = names.get(call.name, ToolName(call.name))
    item: dict[str, Any] = {"id": new_id("ctc" if wire.custom else "fc"), "call_id": call.id or new_id("call"),
                            "name": wire.name, "status": "completed"}
    if wire.namespace:
        item["namespace"] = wire.namespace
    if wire.custom:
        return {**item, "type": "custom_tool_call", "input": str(call.arguments.get("input", ""))}
    return {**item, "type": "function_call", "arguments": call.arguments_json()}


def output_items(whole: Chunk, names: dict[str, ToolName]) -> list[dict[str, Any]]:
    """A whole answer as output items: its reasoning, its message, its calls."""
    out = [reasoning_item(new_id("rs"), whole.thinking)] if whole.thinking else []
    if whole.text or not (whole.thinking or whole.tool_calls):
        out.append(message_item(new_id("msg"), whole.text, status_of(whole), logprobs=whole.logprobs))
    return out + [call_item(c, names) for c in whole.tool_calls]


def status_of(whole: Chunk) -> str:
    return "incomplete" if whole.finish_reason in _INCOMPLETE else "completed"


_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}  # reason -> incomplete_details


# -- stored input items --------------------------------------------------------------------------------------------

_ID_PREFIXES = {"message": "msg", "function_call": "fc", "custom_tool_call": "ctc", "reasoning": "rs",
                "compaction": "cmp"}
_PAGE_SIZE, _MAX_PAGE = 20, 100  # OpenAI's default and largest `limit` for input_items


# fields the SDK's content part types require, as OpenAI lists a part sent without them
_PART_DEFAULTS: dict[Any, dict[str, Any]] = {"output_text": {"annotations": []}, "input_image": {"detail": "auto"}}
# the SDK's `*Item` types that require a status
_LISTED_WITH_STATUS = ("message", "function_call", "custom_tool_call", *_CALL_OUTPUTS)


def stored_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as `input_items` lists it: with an id of its own (kept, so pages agree) and a status, a
    message's text as a content part, each part of a message or of a call's output with the fields the SDK's part
    types require (an assistant's text its annotations, an image its detail), as OpenAI answers them."""
    out = {**item, "id": item.get("id") or new_id(_ID_PREFIXES.get(str(item.get("type")), "item"))}
    if item.get("type") in _LISTED_WITH_STATUS:
        out.setdefault("status", "completed")
    content = item.get("content")
    if item.get("type") == "message" and isinstance(content, str):
        content = [{"type": "output_text" if item.get("role") == "assistant" else "input_text", "text": content}]
    if item.get("type") == "message" and isinstance(content, list):
        out["content"] = _with_defaults(content)
    if item.get("type") in _CALL_OUTPUTS and isinstance(item.get("output"), list):
        out["output"] = _with_defaults(item["output"])
    return out


def _with_defaults(parts: list[Any]) -> list[Any]:
    return [{**_PART_DEFAULTS.get(p.get("type"), {}), **p} if isinstance(p, dict) else p for p in parts]


def input_page(items: list[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """GET /v1/responses/{id}/input_items: `order` (desc, OpenAI's default, or asc), `limit` items after `after`, or
    before `before` (in Azure's reference and older SDKs: ignored, it gave the first page)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("order: must be 'asc' or 'desc'", param="order")
    listed = items[::-1] if order == "desc" else items
    limit = query_int(query, "limit", _PAGE_SIZE, 1, _MAX_PAGE)
    start, end, more = window([i["id"] for i in listed], limit, query.get("after"), query.get("before"),
                              ("after", "before"))
    page = listed[start:end]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": more}
