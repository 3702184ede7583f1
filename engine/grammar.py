"""Output grammars: what a request's output must match, as llguidance grammar text, built from an Ollama `format`,
an OpenAI `response_format` or a tool list. Torch-free, so an adapter may check a schema for any backend before it
is sent (adapters/output_format.py); engine/constrained.py masks the engine's tokens with them.
"""

from __future__ import annotations

import json
import re

import llguidance

from engine.tool_schema import tool_call_schema

# Compact, fixed whitespace: small models given free whitespace can pad forever. `lenient` ignores
# schema keywords llguidance does not implement instead of rejecting the request.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


def json_grammar(schema: dict | None) -> str:
    """Grammar for one JSON value matching schema; None means any JSON object (Ollama `format: "json"`). llguidance
    takes a dict's integers within 64 bits only, and any in JSON text (a bound past them read as a float)."""
    schema = schema or {"type": "object"}
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as e:
        if "not JSON serializable" not in str(e):
            raise
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)


def grammar_for(format: str | dict | None = None, tools: list[dict] | None = None,
                tool_choice: str | dict | None = None) -> str | None:
    """The grammar a request's output must match, or None for free text; ValueError if a schema is invalid.

    format: None, "json" or a JSON Schema. tools: [{"name", "parameters"}]; tool_choice "none" ignores
    them, "required" or {"function": {"name"}} forces a call, anything else ("auto") allows either a
    call or an answer: JSON matching format if given, else free text that does not start with "{" and in
    which every `<tool_call>` the model opens (Hermes / Qwen format) must hold a valid call and close."""
    grammar = _grammar(format, tools, tool_choice)
    if grammar is not None:
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if failed:
            raise ValueError(f"invalid output grammar: {headline(messages[0])}")
    return grammar


_AT = re.compile(r"^at \d+\(\d+\): ")  # llguidance's line(column) in the grammar


def headline(message: str) -> str:
    """llguidance's error without the place in Velo's grammar and the grammar's lines after it, which mean nothing
    to a client whose tool schema (`"required": {}`) or format was the mistake. A regex's error is its first line
    ("regex parse error:"), the pattern, a line of carets and the reason: the pattern and the reason are kept."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    head = lines[0] if lines else message
    if head.endswith(":") and len(lines) > 1:
        head = " ".join([head, *(line for line in lines[1:] if set(line) != {"^"})])
    return _AT.sub("", head, count=1)


def _grammar(format, tools, tool_choice) -> str | None:
    if not tools or tool_choice == "none":
        return None if format is None else json_grammar(None if format == "json" else format)
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or tool_choice).get("name")
        tools = [t for t in tools if t["name"] == name] or tools
    call = tool_call_schema(tools)
    if tool_choice == "required" or isinstance(tool_choice, dict):
        return json_grammar(call)
    if format is not None:
        answer = _lark_json(format if isinstance(format, dict) else {"type": "object"})
        return llguidance.LLMatcher.grammar_from_lark(
            f"start: answer | call\nanswer: {answer}\ncall: {_lark_json(call)}\n")
    return llguidance.LLMatcher.grammar_from_lark(_LAZY_CALLS.format(call=_lark_json(call)))


# Free text until the model writes "<tool_call>" (a lazy lexeme: it ends at the first one), then a valid call and
# "</tool_call>", any number of times; or one bare call. Free text may not start with "{": a model that opens a
# JSON object makes a call.
_LAZY_CALLS = """start: call | tagged* TEXT
call: {call}
tagged: tagged_hd /\\s*/ call /\\s*/ "</tool_call>"
tagged_hd[lazy]: ANY "<tool_call>"
ANY: /([^{{](.|\\n)*)?/
TEXT: /\\s*([^{{\\s](.|\\n)*)?/
"""


def _lark_json(schema: dict) -> str:
    return "%json " + json.dumps(schema | {"x-guidance": JSON_OPTIONS})
