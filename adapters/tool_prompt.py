"""Tools for a model whose chat template does not render them (SmolLM2's, many GGUFs', an Ollama model without
the `tools` capability): Velo writes them into the conversation itself, in the Hermes format that Qwen2.5's own
template uses and that small instruction-tuned models follow, so nothing the client offered is dropped:

- the tool signatures and how to call them go into the system prompt (`<tools>...</tools>`, `<tool_call>` calls);
- earlier assistant calls become `<tool_call>{"name", "arguments"}</tool_call>` text in that turn;
- tool results become user turns wrapped in `<tool_response>...</tool_response>`.

The model's answer is plain text then; the proxy's tool-call extraction (proxy/tools/) reads the calls back.

Written byte for byte as Qwen2.5's template writes them (JSON as its `tojson`; a run of tool results one user turn):
what the model wrote is then what it reads back next turn, and a turn whose call is forced (the tools in the prompt)
reads the same prompt as one with the tools rendered natively, so neither loses the turn before from a prefix cache.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

from engine.tool_schema import tool_call_schema

from .protocol import ChatRequest, Message, Tool, ToolCall

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_INSTRUCTIONS = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML \
tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def call_schema(tools: list[Tool]) -> dict:
    """A JSON Schema that only a call of one of `tools` matches: `{"name": ..., "arguments": {...}}`."""
    return tool_call_schema([{"name": t.name, "parameters": t.parameters} for t in tools])


def _json(value: Any) -> str:
    """JSON as chat templates' `tojson` writes it (transformers', llama.cpp's): `", "` and `": "` between items, the
    way models tuned on those templates write their own calls. Compact JSON made a SmolLM2 call the engine had just
    generated (`{"name": "list_dir", ...`) differ from its rendering in the next turn's prompt at its second token."""
    return json.dumps(value, ensure_ascii=False)


def tools_block(tools: list[Tool]) -> str:
    signatures = "\n".join(_json({"type": "function", "function": {
        "name": t.name, "description": t.description, "parameters": t.parameters}}) for t in tools)
    return _INSTRUCTIONS.format(tools=signatures)


def call_text(call: ToolCall) -> str:
    return f"{CALL_OPEN}\n{_json({'name': call.name, 'arguments': call.arguments})}\n{CALL_CLOSE}"


def in_prompt(req: ChatRequest) -> ChatRequest:
    """`req` with its tools, calls and tool results written into plain system, assistant and user turns."""
    block = tools_block(req.tools)
    messages = list(req.messages)
    if messages and messages[0].role == "system":
        messages[0] = replace(messages[0], content=f"{messages[0].content}\n\n{block}")
    else:
        messages.insert(0, Message("system", block))
    return replace(req, messages=_plain_turns(messages), tools=[], tool_choice=None, tools_in_prompt=False)


def _plain_turns(messages: list[Message]) -> list[Message]:
    """Calls as text in their assistant turns; each run of tool results one user turn, a `<tool_response>` each, as
    Qwen2.5's template groups them."""
    out: list[Message] = []
    for results, run in itertools.groupby(messages, key=lambda m: m.role == "tool"):
        if results:
            out.append(Message("user", "\n".join(f"<tool_response>\n{m.content}\n</tool_response>" for m in run)))
        else:
            out += [_plain(m) for m in run]
    return out


def _plain(m: Message) -> Message:
    if m.tool_calls:
        calls = "\n".join(call_text(c) for c in m.tool_calls)
        return replace(m, content=f"{m.content}\n{calls}" if m.content else calls, tool_calls=[])
    return m
