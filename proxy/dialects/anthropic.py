"""The Anthropic Messages dialect: request bodies -> internal requests, internal chunks -> messages and SSE events.

Shapes follow Anthropic's API reference as the official `anthropic` SDK types model them (`types/message.py`,
`raw_*_event.py`, `message_create_params.py`) and what Claude Code was captured sending (../shared/PROTOCOLS.md):
`system` as blocks with `cache_control`, a `role: "system"` message inside `messages`, `thinking: {"type":
"adaptive"}`. Tool calls are `tool_use` blocks whose `input` is an object; tool results come back as `tool_result`
blocks in a user turn, and become internal "tool" messages ahead of that turn's text, as Ollama converts them.
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from adapters import options
from adapters.errors import BadRequest, ContextOverflow, UnusableFormat, VeloError
from adapters.exact_json import dumps
from adapters.fields import body_object, get, get_model, string_list
from adapters.protocol import ChatRequest, Chunk, Message, ModelInfo, Tool, ToolCall, Usage

from .. import context_edits
from ..context_edits import Applied, ClearThinking, ClearToolUses, Edit
from . import documents, new_id, tool_choice
from .anthropic_tools import client_tool
from .openai import effort_level
from .paging import query_int, window

# A stream's heartbeats before its first block are Anthropic's `ping` for this long, then empty text deltas: Claude
# Code's idle watchdog skips pings and gave up after 90 s in its older versions (300 s now), and a text block opened
# for heartbeats stays in the message the SDKs assemble, empty, before a tool_use or thinking block (real Anthropic
# answers never have one). 60 s + one `heartbeat_s` (15 s) still lands under 90 s.
CONTENT_HEARTBEATS_AFTER_S = 60.0
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
# Anthropic's error types by HTTP status (its API reference, "Errors"); 529 is what its clients retry on.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error",
                529: "overloaded_error"}


# -- requests ------------------------------------------------------------------------------------------------------

@dataclass
class Parsed:
    """A Messages request as Velo runs it, and the tools it could not offer the model (Anthropic's server tools)."""

    request: ChatRequest
    ignored_tools: list[str] = field(default_factory=list)
    edits: tuple[Edit, ...] | None = None  # `context_management`, when asked for (None: not asked)


def parse_messages(body: Any, count_only: bool = False) -> Parsed:
    """POST /v1/messages (and, with `count_only`, /v1/messages/count_tokens, which has no max_tokens)."""
    body = body_object(body)
    opts = options.read("anthropic", body)
    if not count_only:
        max_tokens = get(body, "max_tokens", int, required=True)
        if max_tokens < 1:
            raise BadRequest("max_tokens: must be at least 1", param="max_tokens")
    raw_messages = get(body, "messages", list, required=True)
    messages = _system(body.get("system"))
    names: dict[str, str] = {}  # tool_use id -> tool name, for the tool results that answer them
    for i, raw in enumerate(raw_messages):
        messages += _message(raw, f"messages.{i}", names)
    messages = _combined(_in_place(messages))
    if messages and messages[-1].empty_assistant:  # allowed last, and answered as without it; passed on, vLLM's
        messages.pop()  # template wrote it as a closed empty turn before the model's own
    if all(m.role == "system" for m in messages):  # Anthropic's 400; a model asked nothing writes on at random (an
        # empty assistant turn alone went on as an empty chat, which Ollama answers with nothing: a model load)
        raise BadRequest("messages: at least one message is required", param="messages")
    tools, ignored = _tools(body)
    config = get(body, "output_config", dict, {})
    get(body, "metadata", dict)  # read by no backend; Anthropic's 400 where it is no object, as for any field
    choice, parallel = _tool_choice(body.get("tool_choice"))
    return Parsed(ChatRequest(model=get_model(body), messages=messages, options=opts, tools=tools,
                              tool_choice=tool_choice.checked(choice, tools, ignored), format=_format(config),
                              stream=get(body, "stream", bool, False), think=_think(body, config),
                              parallel_tool_calls=parallel), ignored,
                  _edits(body.get("context_management")))


# Claude Code (2.1.36 and later) sends this as its first system block, with a `cch=` hash of the body (and a
# `cc_version` suffix) that changes on every request: kept, it made each turn's prompt differ from the one before at
# its 38th token, and the engine read a 2,300-token Claude Code-like prompt anew each turn (32 tokens cached). Its
# `key=value;` fields only: text after them in the same block (a client that joined the blocks) is kept.
_BILLING = re.compile(r"x-anthropic-billing-header:(?:[ \t]*[\w.-]+=[^;\n]*;)*[ \t]*\n?")


def _system(system: Any) -> list[Message]:
    """The system prompt; Claude Code's billing header is left out: it means nothing to the model, and it changes on
    every turn ahead of everything else, so no backend's prefix cache (the engine's, llama-server's) could reuse any
    of the turn before (llama-server's own /v1/messages blanks its `cch=` for the same reason)."""
    if isinstance(system, str):
        system = _unbilled(system)
    elif isinstance(system, list):
        system = [b for b in map(_unbilled_block, system) if b is not None]
    if system is None or system in ("", []):
        return []
    if isinstance(system, str):
        return [Message("system", system)]
    return [Message("system", _text_of(system, "system"))]


def _unbilled(text: str) -> str:
    return _BILLING.sub("", text, count=1) if text.startswith("x-anthropic-billing-header:") else text


def _unbilled_block(block: Any) -> Any:
    """The block without a billing header; None where that header was all it held."""
    text = block.get("text") if isinstance(block, dict) else None
    if not isinstance(text, str) or (rest := _unbilled(text)) == text:
        return block
    return {**block, "text": rest} if rest else None


def _text_of(blocks: Any, where: str) -> str:
    """Text blocks joined (a system prompt, or a tool result's content); other blocks are a 400."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise BadRequest(f"{where}: must be a string or an array of text blocks", param=where)
    texts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise BadRequest(f"{where}.{i}: only text blocks are supported here", param=where)
        texts.append(block["text"])
    return "\n".join(texts)


def _in_place(messages: list[Message]) -> list[Message]:
    """`role: "system"` messages inside `messages`, which Claude Code sends since 2.1.154 (its reminders, one more
    each turn, where it wrote them into user turns before; Anthropic places one after a user turn or a tool result):
    one ahead of the conversation joins the system prompt (`_combined`), a later one is user text where it stands.
    Kept as system turns, they were a 400 from every template that wants the roles to alternate after the system
    prompt (Gemma's, Mistral's: "Conversation roles must alternate"); moved into the system prompt, they would change
    the prompt ahead of the whole conversation each turn, and no prefix cache could reuse any of it."""
    begun = False
    out = []
    for m in messages:
        begun = begun or m.role != "system"
        out.append(replace(m, role="user") if begun and m.role == "system" else m)
    return out


def _combined(messages: list[Message]) -> list[Message]:
    """Consecutive system, user or assistant turns as one, as Anthropic's API combines them: a chat template that
    wants the roles to alternate (Gemma's, Mistral's) refused two user turns in a row, which Anthropic answers.
    System and user turns stay paragraphs of their own; assistant text joins as its blocks do, so that a prefill
    split over two turns is continued where its text ends."""
    runs: list[list[Message]] = []
    for m in messages:
        if runs and m.role == runs[-1][0].role and m.role in ("system", "user", "assistant"):
            runs[-1].append(m)
        else:
            runs.append([m])
    return [run[0] if len(run) == 1 else _joined(run) for run in runs]


def _joined(run: list[Message]) -> Message:
    """A run of turns as one, joined once: added to one by one, 100,000 one-word user turns (3.4 MB) held the event
    loop for 2.5 s, and a body at the 32 MB limit for minutes."""
    apart = "" if run[0].role == "assistant" else "\n\n"
    return replace(run[0], content=apart.join(m.content for m in run if m.content),
                   images=[i for m in run for i in m.images], tool_calls=[c for m in run for c in m.tool_calls],
                   thinking="".join(m.thinking for m in run))


def _message(raw: Any, where: str, names: dict[str, str]) -> list[Message]:
    if not isinstance(raw, dict):
        raise BadRequest(f"{where}: must be an object", param="messages")
    role = get(raw, "role", str, required=True)
    if role not in ("user", "assistant", "system"):
        raise BadRequest(f"{where}.role: must be 'user', 'assistant' or 'system', got {role!r}", param="messages")
    content = raw.get("content")
    if isinstance(content, str):
        return [Message(role, content)]
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: must be a string or an array of content blocks", param="messages")
    turn, results = Message(role), []
    for i, block in enumerate(content):
        results += _block(block, f"{where}.content.{i}", turn, names)
    keep = turn.content or turn.images or turn.tool_calls or turn.thinking or not results
    kept = [turn] if keep else []
    return kept + results if role == "assistant" else results + kept  # a server tool's result follows its call


def _block(block: Any, where: str, turn: Message, names: dict[str, str]) -> list[Message]:
    """Adds one content block to `turn`; a tool result instead comes back as its own "tool" message."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        turn.content += get(block, "text", str, required=True)
    elif kind == "image":
        turn.images.append(_image(block.get("source"), where))
    elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):  # a server tool's (or the MCP connector's) call
        # stays in the history, as Ollama keeps a server tool's
        call = ToolCall(get(block, "name", str, required=True), get(block, "input", dict, {}),
                        get(block, "id", str, required=True))
        if call.id in names:  # Anthropic's 400: which call a result answers, and which results an edit clears, is
            raise BadRequest(f"{where}: `tool_use` ids must be unique", param="messages")  # by the id
        names[call.id] = call.name
        turn.tool_calls.append(call)
    elif kind in ("tool_result", "mcp_tool_result"):  # the MCP connector's result has a tool result's shape
        call_id = get(block, "tool_use_id", str, required=True)
        result = Message("tool", tool_call_id=call_id, tool_name=names.get(call_id, ""))
        _tool_result(block.get("content") or "", f"{where}.content", result)
        if get(block, "is_error", bool, False):  # the internal model has no error flag; the model must see it failed
            result.content = f"Error: {result.content}"
        return [result]
    elif isinstance(kind, str) and kind.endswith("_tool_result"):  # web_search_tool_result, web_fetch_..., ...
        call_id = get(block, "tool_use_id", str, required=True)
        return [Message("tool", _server_result(block.get("content")), tool_call_id=call_id,
                        tool_name=names.get(call_id, ""))]
    elif kind in ("document", "search_result"):
        text = _document(block, where) if kind == "document" else _search_result(block, where)
        turn.content += documents.apart(turn.content) + text
    elif kind == "thinking":
        turn.thinking += get(block, "thinking", str, "")
    elif kind != "redacted_thinking":  # encrypted by Anthropic: nothing a local model can read
        raise BadRequest(f"{where}: content blocks of type {kind!r} are not supported", param="messages")
    return []


def _tool_result(content: Any, where: str, result: Message) -> None:
    """A tool result's text and images (Claude Code's Read of a picture), as Ollama's Anthropic API reads them; a
    document (documents.py), a search result (its title, source and text) and a tool reference (tool search's answer:
    the tool's name) as text."""
    if not isinstance(content, list):
        result.content = _text_of(content, where)
        return
    texts = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "image":
            result.images.append(_image(block.get("source"), f"{where}.{i}"))
        elif kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "document":
            texts.append(_document(block, f"{where}.{i}").strip())
        elif kind == "search_result":
            texts.append(_search_result(block, f"{where}.{i}").strip())
        elif kind == "tool_reference":
            texts.append(f"Tool: {get(block, 'tool_name', str, required=True)}")
        else:
            raise BadRequest(f"{where}.{i}: content blocks of type {kind!r} are not supported in a tool result",
                             param=where)
    result.content = "\n".join(texts)


def _server_result(content: Any) -> str:
    """A server tool's result as text, as Ollama writes a web search's (anthropic/anthropic.go): a result per line,
    an error by its code, anything else as its JSON."""
    if isinstance(content, str):
        return content
    items = content if isinstance(content, list) else [content]
    for item in items:
        if isinstance(item, dict) and str(item.get("type")).endswith("_error"):
            return f"{item['type']}: {item['error_code']}" if item.get("error_code") else str(item["type"])
    if items and all(isinstance(i, dict) and i.get("type") == "web_search_result" for i in items):
        return "".join(f"- {i.get('title', '')}: {i.get('url', '')}\n" for i in items)
    return dumps(content).decode()


def _document(block: dict[str, Any], where: str) -> str:
    """A document as text of the turn, under its title and context (documents.py): a plain-text one (a `text`
    source, or `content` of text blocks) as it is, a base64 PDF's text; a URL (which Anthropic fetches: Velo reaches
    no address a client names) or an uploaded file's id (Velo keeps no files) is a note."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text" and isinstance(source.get("data"), str):
        text = source["data"]
    elif kind == "content":
        text = _text_of(source.get("content"), f"{where}.source.content")
    elif kind == "base64" and isinstance(source.get("data"), str):
        text = documents.file_text(source["data"], get(source, "media_type", str, ""))
    elif kind == "url" and isinstance(source.get("url"), str):
        text = documents.note(f"the document at {source['url']}", "Velo fetches no URLs")
    elif kind == "file" and isinstance(source.get("file_id"), str):
        text = documents.note(f"the file {source['file_id']}", "Velo keeps no uploaded files")
    else:
        raise BadRequest(f"{where}.source: a document's source must be text, content, base64, url or file",
                         param="messages")
    return documents.titled(text, *(get(block, key, str) for key in ("title", "context") if block.get(key)))


def _search_result(block: dict[str, Any], where: str) -> str:
    """A search result (a tool's, or user content: Anthropic's search results) as text: its title, source and text,
    apart from the text after it, as a document is."""
    return "\n".join([get(block, "title", str, ""), get(block, "source", str, ""),
                      _text_of(block.get("content") or [], f"{where}.content")]).strip() + "\n\n"


def _image(source: Any, where: str) -> str:
    if not isinstance(source, dict) or source.get("type") != "base64" or not isinstance(source.get("data"), str):
        raise BadRequest(f"{where}.source: only base64 image sources are supported", param="messages")
    return source["data"]


def _tools(body: dict[str, Any]) -> tuple[list[Tool], list[str]]:
    """Client tools ({name, description, input_schema}) and Anthropic's own client tools (bash, text editor, memory:
    anthropic_tools.py); its server tools (web search, code execution, ...) and computer use need Anthropic's
    servers or its trained models, and `mcp_servers` (beta) its connector: they are left out and named in a header."""
    tools, ignored = [], []
    for i, server in enumerate(get(body, "mcp_servers", list, [])):
        if not isinstance(server, dict):
            raise BadRequest(f"mcp_servers.{i}: must be an object", param="mcp_servers")
        ignored.append(f"mcp_servers.{server.get('name', i)}")
    for i, raw in enumerate(get(body, "tools", list, [])):
        if not isinstance(raw, dict):
            raise BadRequest(f"tools.{i}: must be an object", param="tools")
        if raw.get("type") not in (None, "custom"):
            if (tool := client_tool(raw)) is not None:
                tools.append(tool)
            else:
                ignored.append(str(raw.get("name") or raw.get("type")))
            continue
        schema = get(raw, "input_schema", dict, required=True)
        tools.append(Tool(get(raw, "name", str, required=True), get(raw, "description", str, ""), schema))
    tool_choice.named_apart(tools)
    return tools, ignored


def _tool_choice(raw: Any) -> tuple[Any, bool]:
    """Internal form (OpenAI's): None (auto), "none", "required", {"type": "function", "function": {"name"}}; and
    whether calls may come in parallel (not when `disable_parallel_tool_use`)."""
    if raw is None:
        return None, True
    kind = raw.get("type") if isinstance(raw, dict) else None
    parallel = not get(raw, "disable_parallel_tool_use", bool, False) if kind else True
    if kind == "tool":
        return {"type": "function", "function": {"name": get(raw, "name", str, required=True)}}, parallel
    choices = {"auto": None, "any": "required", "none": "none"}
    if not isinstance(kind, str) or kind not in choices:  # a list there was unhashable: a 500
        raise BadRequest("tool_choice.type: must be one of auto, any, tool, none", param="tool_choice")
    return choices[kind], parallel


def _edits(raw: Any) -> tuple[Edit, ...] | None:
    """`context_management.edits` (beta context-management-2025-06-27) as proxy/context_edits.py applies them;
    server-side compaction (`compact_20260112`) is a 400: Velo does not summarise Anthropic conversations."""
    if raw is None:
        return None
    where = "context_management.edits"
    edits = get(body_object(raw), "edits", list, [])
    out: list[Edit] = []
    for i, e in enumerate(edits):
        kind = e.get("type") if isinstance(e, dict) else None
        if kind == context_edits.TOOL_USES:
            out.append(_clear_tool_uses(e, f"{where}.{i}"))
        elif kind == context_edits.THINKING:
            keep = e.get("keep")
            all_turns = keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all")
            out.append(ClearThinking(None if all_turns else _amount(e, "keep", "thinking_turns", f"{where}.{i}",
                                                                    default=ClearThinking.keep)))
        else:
            raise BadRequest(f"{where}.{i}.type: must be {context_edits.TOOL_USES} or {context_edits.THINKING}",
                             param="context_management")
    return tuple(out)


def _clear_tool_uses(e: dict[str, Any], where: str) -> ClearToolUses:
    trigger = e.get("trigger")
    by_uses = isinstance(trigger, dict) and trigger.get("type") == "tool_uses"
    limit = _amount(e, "trigger", "tool_uses" if by_uses else "input_tokens", where,
                    default=ClearToolUses.trigger_tokens)
    inputs = e.get("clear_tool_inputs") or False
    if not isinstance(inputs, bool) and not (isinstance(inputs, list) and all(isinstance(n, str) for n in inputs)):
        raise BadRequest(f"{where}.clear_tool_inputs: must be a boolean or a list of tool names",
                         param="context_management")
    return ClearToolUses(trigger_tokens=None if by_uses else limit, trigger_uses=limit if by_uses else None,
                         keep=_amount(e, "keep", "tool_uses", where, default=ClearToolUses.keep),
                         clear_at_least=_amount(e, "clear_at_least", "input_tokens", where, default=0),
                         exclude=frozenset(string_list(e, "exclude_tools")),
                         clear_inputs=inputs if isinstance(inputs, bool) else frozenset(inputs))


def _amount(e: dict[str, Any], key: str, kind: str, where: str, default: int | None = None) -> int:
    """`{"type": kind, "value": n}`, n a count from 0."""
    raw = e.get(key)
    if raw is None and default is not None:
        return default
    value = raw.get("value") if isinstance(raw, dict) and raw.get("type") == kind else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{where}.{key}: must be {{type: '{kind}', value: a count}}", param="context_management")
    return value


def _think(body: dict[str, Any], config: dict[str, Any]) -> bool | str | None:
    """`enabled` turns thinking on (at `output_config.effort` where given), `disabled` off; `adaptive` (what
    Claude Code sends) leaves it to the model, so a model that cannot think still answers."""
    thinking = get(body, "thinking", dict)
    kind = thinking.get("type") if thinking else None
    level = effort_level(config.get("effort"), "output_config.effort:", "output_config")  # whatever `thinking` says
    if kind == "enabled":
        get(thinking, "budget_tokens", int)  # no backend takes a budget, but its type is checked as Anthropic does
        return True if level is None else level
    if kind == "disabled":
        return False
    if kind not in (None, "adaptive"):
        raise BadRequest("thinking.type: must be one of enabled, disabled, adaptive", param="thinking")
    return None


def _format(config: dict[str, Any]) -> Any:
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise BadRequest("output_config.format: must be {type: 'json_schema', schema: {...}}", param="output_config")
    return fmt["schema"]


# -- answers -------------------------------------------------------------------------------------------------------

def stop_reason(chunk: Chunk, max_tokens: int | None = None, stops: tuple[str, ...] = ()) -> str:
    """`stop_sequence` where the backend said which of the client's `stops` ended the answer (the engine, vLLM,
    SGLang, llama-server); a stop string the client did not send (a preset's or a model's `stop` in config.toml) ends
    it as `end_turn`, as Anthropic names only the request's own `stop_sequences`;
    `model_context_window_exceeded` where the answer was cut before the client's `max_tokens`: the context ran out
    (Claude Code says so, where for `max_tokens` it tells the user to raise its output limit; it asks 32,000 of
    models whose whole window is often 8-32k)."""
    if chunk.tool_calls:
        return "tool_use"
    if chunk.stop_sequence in stops and chunk.finish_reason == "stop":
        return "stop_sequence"
    if chunk.finish_reason == "length" and max_tokens and chunk.usage and chunk.usage.completion_tokens < max_tokens:
        return "model_context_window_exceeded"
    return _STOP_REASONS.get(chunk.finish_reason or "stop", "end_turn")


def _matched(chunk: Chunk, stops: tuple[str, ...]) -> str | None:
    return chunk.stop_sequence if stop_reason(chunk, stops=stops) == "stop_sequence" else None


def usage_object(usage: Usage | None, estimate: int = 0) -> dict[str, int]:
    """Anthropic's split, as llama-server's own Messages API makes it: the prompt tokens a prefix cache served are
    `cache_read_input_tokens`, the rest `input_tokens` (clients add the two for the context used). Where the backend
    counted nothing (an OpenAI-compatible server that ignores `stream_options`), the input is `estimate`, as
    message_start has it: message_delta's 0 replaced it, and the SDK and Claude Code took the context for empty."""
    u = usage or Usage(prompt_tokens=estimate)
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": u.cached_tokens}


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id or new_id("toolu"), "name": call.name, "input": call.arguments}


def context_management_object(applied: list[Applied]) -> dict[str, Any]:
    """What context editing did, as Anthropic reports it (`context_management.applied_edits`)."""
    return {"applied_edits": [{"type": a.kind, "cleared_input_tokens": a.tokens, (
        "cleared_thinking_turns" if a.kind == context_edits.THINKING else "cleared_tool_uses"): a.cleared}
        for a in applied]}


def message_object(msg_id: str, model: str, whole: Chunk, max_tokens: int | None,
                   context: dict[str, Any] | None = None, stops: tuple[str, ...] = (),
                   input_tokens: int = 0) -> dict[str, Any]:
    """A whole non-streamed answer (with `context_management` where the request asked for context editing);
    `max_tokens` and `stops` are the client's own, `input_tokens` the estimate for a backend that counts none."""
    content: list[dict[str, Any]] = []
    if whole.thinking:
        content.append({"type": "thinking", "thinking": whole.thinking, "signature": ""})
    if whole.text or not (whole.thinking or whole.tool_calls):
        content.append({"type": "text", "text": whole.text})
    content += [_tool_use(c) for c in whole.tool_calls]
    out = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
           "stop_reason": stop_reason(whole, max_tokens, stops), "stop_sequence": _matched(whole, stops),
           "usage": usage_object(whole.usage, input_tokens)}
    return out if context is None else {**out, "context_management": context}


def event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dumps(obj) + b"\n\n"


@dataclass
class MessageStream:
    """Internal chunks -> Anthropic's SSE events: message_start and a ping, then content blocks (thinking, text,
    tool_use) each opened, filled by deltas and stopped, then message_delta (stop_reason, usage) and message_stop.
    message_start's input tokens are estimated before the backend counts them, as Ollama's Anthropic API does:
    LangChain reads them there, and the SDK and Claude Code take message_delta's count, which follows."""

    msg_id: str
    model: str
    max_tokens: int | None = None  # the client's, which tells a cut by the context window from one by the limit
    context: Callable[[], dict[str, Any]] | None = None  # message_delta's `context_management`, when asked for
    input_tokens: int = 0  # message_start's: an estimate (as Ollama's); message_delta has the backend's count
    stops: tuple[str, ...] = ()  # the client's `stop_sequences`, the only ones a `stop_sequence` names
    started: bool = False
    done: bool = False
    index: int = -1
    open: str | None = None  # the kind of the content block being filled
    begun: float = field(default_factory=time.monotonic)

    def encode(self, chunk: Chunk) -> bytes:
        if self.done:  # a heartbeat the timer encoded while the last events waited for a slow client to read them
            return b""
        if chunk.heartbeat:
            return b"".join(self._start() if not self.started else self._still_writing())
        out = [] if self.started else self._start()
        if chunk.thinking:
            out += self._block("thinking", {"thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": chunk.thinking}))
        if chunk.text:
            out += self._block("text", {"text": ""})
            out.append(self._delta({"type": "text_delta", "text": chunk.text}))
        for call in chunk.tool_calls:
            block = _tool_use(call)
            out += self._block("tool_use", {**block, "input": {}}, fresh=True)
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments_json()}))
        if chunk.finish_reason is not None:
            out += self._end(stop_reason(chunk, self.max_tokens, self.stops), chunk.usage, _matched(chunk, self.stops))
        return b"".join(out)

    def finish(self) -> bytes:
        """Closes a stream that ended without a finish reason (it never does when the backend behaves)."""
        return b"" if self.done else b"".join(([] if self.started else self._start()) + self._end("end_turn", None))

    def _start(self) -> list[bytes]:
        self.started = True
        message = {"id": self.msg_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": usage_object(Usage(prompt_tokens=self.input_tokens))}
        return [event("message_start", {"type": "message_start", "message": message}), event("ping", {"type": "ping"})]

    def _still_writing(self) -> list[bytes]:
        """A heartbeat after the start: an empty delta of the open block; before any block, a `ping` for
        CONTENT_HEARTBEATS_AFTER_S, then an empty delta of a text block opened for it (the answer's text goes on in
        it). A `ping` is what Claude Code's idle watchdog skips: it abandoned, after 300 s of pings, every turn whose
        20k-token prompt a CPU read for longer, and retried."""
        if self.open is None and time.monotonic() - self.begun < CONTENT_HEARTBEATS_AFTER_S:
            return [event("ping", {"type": "ping"})]
        kind = self.open or "text"
        out = self._block(kind, {"text": ""}) if self.open is None else []
        return out + [self._delta({"text": {"type": "text_delta", "text": ""},
                                   "thinking": {"type": "thinking_delta", "thinking": ""},
                                   "tool_use": {"type": "input_json_delta", "partial_json": ""}}[kind])]

    def _block(self, kind: str, start: dict[str, Any], fresh: bool = False) -> list[bytes]:
        if self.open == kind and not fresh:
            return []
        out = self._close()
        self.index, self.open = self.index + 1, kind
        block = {"type": kind, **start}
        out.append(event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                 "content_block": block}))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _close(self) -> list[bytes]:
        """A thinking block ends with its signature, as Anthropic's do: the AI SDK takes a block's signature only from
        a `signature_delta`, and without one dropped the thinking from the next turn ("unsupported reasoning
        metadata"). Velo's is empty: there is nothing to sign (the non-streamed answer says "" too)."""
        if self.open is None:
            return []
        out = [self._delta({"type": "signature_delta", "signature": ""})] if self.open == "thinking" else []
        self.open = None
        return out + [event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _end(self, reason: str, usage: Usage | None, stop: str | None = None) -> list[bytes]:
        """An answer with no content at all ends with an empty text block, as the whole answer has one
        (`message_object`)."""
        self.done = True
        out = (self._block("text", {"text": ""}) if self.index < 0 else []) + self._close()
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop},
                 "usage": usage_object(usage, self.input_tokens)}
        if self.context is not None:
            delta["context_management"] = self.context()
        out.append(event("message_delta", delta))
        out.append(event("message_stop", {"type": "message_stop"}))
        return out


# -- models --------------------------------------------------------------------------------------------------------

_PAGE_SIZE, _MAX_PAGE = 20, 1000  # Anthropic's default and largest `limit` for GET /v1/models


def model_object(info: ModelInfo) -> dict[str, Any]:
    """Anthropic's ModelInfo. `capabilities` says what Velo accepts for this model: images where the model has
    vision, thinking where it thinks (`enabled` and `adaptive` are accepted on any model, as Ollama's Anthropic API
    does), structured output and context editing everywhere (Velo does both); no other server-side feature."""
    caps, thinks = info.capabilities, "thinking" in info.capabilities

    def has(supported: bool) -> dict[str, bool]:
        return {"supported": supported}
    capabilities = {
        "batch": has(False), "citations": has(False), "code_execution": has(False), "pdf_input": has(False),
        "context_management": {**has(True), context_edits.TOOL_USES: has(True), context_edits.THINKING: has(True),
                               "compact_20260112": has(False)},
        "image_input": has("vision" in caps), "structured_outputs": has(True),
        "server_tools": {**has(False), "code_execution": has(False), "web_search": has(False)},
        "effort": {**has(thinks), **{level: has(thinks) for level in ("low", "medium", "high", "max")}},
        "thinking": {**has(thinks), "types": {"adaptive": has(True), "enabled": has(True), "disabled": has(True),
                                               "between_tools": has(False)}},
    }
    return {"type": "model", "id": info.name, "display_name": info.name, "created_at": info.modified_at,
            "lifecycle": "active", "line": None, "deprecated_at": None, "retires_at": None,
            "max_input_tokens": info.context_length, "max_tokens": info.context_length, "capabilities": capabilities}


def model_page(infos: list[ModelInfo], query: Mapping[str, str]) -> dict[str, Any]:
    """GET /v1/models: one page of `limit` models, after `after_id` or before `before_id`, in Velo's listing order;
    `has_more` looks the way the page went, as Anthropic's cursor pagination (and its SDK's iterator) reads it."""
    limit = query_int(query, "limit", _PAGE_SIZE, 1, _MAX_PAGE)
    start, end, more = window([info.name for info in infos], limit, query.get("after_id"), query.get("before_id"),
                              ("after_id", "before_id"), "model")
    page = infos[start:end]
    return {"data": [model_object(info) for info in page], "has_more": more,
            "first_id": page[0].name if page else None, "last_id": page[-1].name if page else None}


# -- errors --------------------------------------------------------------------------------------------------------

def error_status(err: VeloError) -> int:
    """Anthropic's status for Velo's error: a backend that is down is 529 overloaded (its clients retry it with
    backoff); a full queue stays a 429 with its Retry-After."""
    return 529 if err.status == 503 else err.status


def error_object(err: VeloError, request_id: str | None = None) -> dict[str, Any]:
    status = error_status(err)
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    message = f"prompt is too long: {err.tokens} tokens > {err.limit} maximum" \
        if isinstance(err, ContextOverflow) else err.message  # Anthropic's wording, which Claude Code acts on
    if isinstance(err, UnusableFormat):  # its error has no `param`: the message names the field, as the dialect's do
        message = f"output_config.format: {message}"
    obj: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    return obj if request_id is None else {**obj, "request_id": request_id}


def error_event(err: VeloError) -> bytes:
    return event("error", error_object(err))
