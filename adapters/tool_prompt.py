"""Tools for a model whose chat template does not render them (SmolLM2's, many GGUFs', an Ollama model without
the `tools` capability): Velo writes them into the conversation itself, in the Hermes format that Qwen2.5's own
template uses and that small instruction-tuned models follow, so nothing the client offered is dropped:

- the tool signatures and how to call them go into the system prompt (`<tools>...</tools>`, `<tool_call>` calls);
- earlier assistant calls become `<tool_call>{"name", "arguments"}</tool_call>` text in that turn;
- tool results become user turns wrapped in `<tool_response>...</tool_response>`.

The model's answer is plain text then; the proxy's tool-call extraction (proxy/tools/) reads the calls back.
"""
from __future__ import annotations

from dataclasses import replace

import orjson

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


def tools_block(tools: list[Tool]) -> str:
    signatures = "\n".join(orjson.dumps({"type": "function", "function": {
        "name": t.name, "description": t.description, "parameters": t.parameters}}).decode() for t in tools)
    return _INSTRUCTIONS.format(tools=signatures)


def call_text(call: ToolCall) -> str:
    return f"{CALL_OPEN}\n{orjson.dumps({'name': call.name, 'arguments': call.arguments}).decode()}\n{CALL_CLOSE}"


def in_prompt(req: ChatRequest) -> ChatRequest:
    """`req` with its tools, calls and tool results written into plain system, assistant and user turns."""
    block = tools_block(req.tools)
    messages = list(req.messages)
    if messages and messages[0].role == "system":
        messages[0] = replace(messages[0], content=f"{messages[0].content}\n\n{block}")
    else:
        messages.insert(0, Message("system", block))
    return replace(req, messages=[_plain(m) for m in messages], tools=[], tool_choice=None, tools_in_prompt=False)


def _plain(m: Message) -> Message:
    if m.role == "tool":
        return Message("user", f"<tool_response>\n{m.content}\n</tool_response>")
    if m.tool_calls:
        calls = "\n".join(call_text(c) for c in m.tool_calls)
        return replace(m, content=f"{m.content}\n{calls}" if m.content else calls, tool_calls=[])
    return m
