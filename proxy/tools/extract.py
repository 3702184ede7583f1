"""Find tool calls written as text, in every shape small models use.

The text is cut into regions that may hold a call: a model family's tags (Hermes/Qwen `<tool_call>`, Llama 3
`<|python_tag|>`, Mistral `[TOOL_CALLS]`, `<function=name>`), a ```json fence, or a bare JSON object/array in
prose. The same `region_at` serves whole messages and the streaming hold-back, so both agree on what a call is.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Collection

import orjson

from proxy.tools.repair import BRACKETS, MAX_REPAIR_CHARS, Unrepairable, parse_json, parse_json_values
from proxy.tools.scan import Brackets, Closer, EndSearch, Pattern

_START = re.compile(r"<tool_call>|<function=|<\|python_tag\|>|\[TOOL_CALLS\]|```|[{\[]")
_MARKERS = ("<tool_call>", "<function=", "<|python_tag|>", "[TOOL_CALLS]", "```")
# a fence's header ends at its line's end, or where the JSON starts on the same line: SmolLM2 wrote ```{...}``` and
# ```json {...} ```, whose fences were left in the content around the call taken out
_FENCE = re.compile(r"```[ \t]*([\w-]*)[ \t]*(?:\n|(?=[{\[]))")
_FENCE_LANGS = {"", "json", "json5", "tool_call", "tool_code", "tool", "function"}
_STRAY_CLOSERS = re.compile(r"[ \t]*[}\]]*")
_END_OF_TURN = re.compile(r"<\|eom_id\|>|<\|eot_id\|>|</s>")
_MISTRAL_V11 = re.compile(r"\s*([\w.-]+)\[ARGS\]")
_FUNCTION_TAG = re.compile(r"<function=([\w.-]+)>")
_CALL_KEYS = ("name", "function", "tool", "tool_name", "arguments", "parameters", "args", "input", "tool_calls",
              "type", "id", "tool_input")
_FIRST_KEY = re.compile(r"""\s*(\[\s*)?\{\s*(["']?)(\w*)(["':\s]?)""")
NAME_KEYS = ("name", "tool_name", "tool", "function")
ARG_KEYS = ("arguments", "parameters", "args", "input", "tool_input")


_HEADER_MAX = 256  # a tag's or fence's header, and a JSON value's first key, are found within this many characters
_NON_SPACE = re.compile(r"\S")
_MEMBER_OBJECT = re.compile(r"\s*:\s*\{")  # after a key: its value is an object
_ARGS_OBJECT = re.compile(r'"(%s)"\s*:\s*\{' % "|".join(ARG_KEYS))  # a key of ARG_KEYS whose value is an object
_DECODER = json.JSONDecoder()


@dataclass
class Region:
    """text[start:end] may hold calls, its body is text[body_start:body_end]; `complete` is False while a stream
    could still extend it, and then `search` continues looking for its end in the extended text."""

    start: int
    end: int
    kind: str  # "tag" | "python_tag" | "mistral" | "function" | "fence" | "code" | "json"
    text: str
    body_start: int
    body_end: int
    complete: bool
    name: str = ""  # `<function=name>` gives the name outside the JSON
    search: EndSearch | None = None

    @property
    def body(self) -> str:
        return self.text[self.body_start:self.body_end]


@dataclass
class RawCall:
    """A call as written: the name as found and arguments not yet validated (with their text, where the backend
    gave them as one: ToolCall.text)."""

    name: str
    arguments: Any
    fixes: list[str] = field(default_factory=list)
    text: str = ""


def next_start(text: str, pos: int = 0) -> int:
    """Index of the next place a call could begin, counting a marker cut off at the end of `text`."""
    m = _START.search(text, pos)
    cut = _partial_marker(text, pos)
    if m is None:
        return cut if cut is not None else -1
    return m.start() if cut is None else min(m.start(), cut)


def is_partial_marker(text: str, i: int) -> bool:
    """True when text[i:] is the beginning of a marker that the next chunk may complete."""
    rest = len(text) - i
    return any(rest < len(mk) and mk.startswith(text[i:]) for mk in _MARKERS) if rest < 14 else False


def _partial_marker(text: str, pos: int) -> int | None:
    for i in range(max(pos, len(text) - 13), len(text)):
        if text[i] in "<[`" and is_partial_marker(text, i):
            return i
    return None


def region_at(text: str, i: int, final: bool, search: EndSearch | None = None) -> Region | None:
    """The region starting at text[i], or None when no call can start there (or a marker is cut off).

    With `final` False an unfinished region comes back incomplete; with True it runs to the end of the text.
    `search` is the incomplete region's own from a shorter text: the search for its end goes on from there.
    """
    if text.startswith("<tool_call>", i):
        return _closed(text, i, len("<tool_call>"), "tag", final, search or Closer("</tool_call>", i + 11))
    if text.startswith("<function=", i):
        m = _FUNCTION_TAG.match(text, i, min(len(text), i + _HEADER_MAX))
        if m is None:
            header_done = text.find(">", i, i + _HEADER_MAX) >= 0 or len(text) - i >= _HEADER_MAX
            return None if final or header_done else Region(i, len(text), "function", text, i, i, False)
        r = _closed(text, i, m.end() - i, "function", final, search or Closer("</function>", m.end()))
        r.name = m.group(1)
        return r
    if text.startswith("<|python_tag|>", i):
        return _closed(text, i, len("<|python_tag|>"), "python_tag", final, search or Pattern(_END_OF_TURN, 10, i))
    if text.startswith("[TOOL_CALLS]", i):
        return _closed(text, i, len("[TOOL_CALLS]"), "mistral", final, search or Pattern(_END_OF_TURN, 10, i))
    if text.startswith("```", i):
        return _fence_region(text, i, final, search)
    if text[i:i + 1] in ("{", "["):
        return _json_region(text, i, final, search)
    return None  # a marker cut off at the end: the caller holds it until more text arrives


def _closed(text: str, i: int, open_len: int, kind: str, final: bool, search: EndSearch) -> Region:
    found = search.find(text)
    if found is not None:
        return Region(i, found[1], kind, text, i + open_len, found[0], True)
    return Region(i, len(text), kind, text, i + open_len, len(text), final, search=search)


def _fence_region(text: str, i: int, final: bool, search: EndSearch | None) -> Region | None:
    m = _FENCE.match(text, i, min(len(text), i + _HEADER_MAX))
    if m is None:
        header_done = text.find("\n", i, i + _HEADER_MAX) >= 0 or len(text) - i >= _HEADER_MAX or final
        return None if header_done else Region(i, len(text), "fence", text, len(text), len(text), False)
    kind = "fence" if m.group(1).lower() in _FENCE_LANGS else "code"  # code in another language is never a call
    r = _closed(text, i, m.end() - i, kind, final, search or Closer("```", m.end()))
    if kind == "code":
        r.body_end = r.body_start
    return r


def _json_region(text: str, i: int, final: bool, search: EndSearch | None) -> Region:
    """A balanced JSON value, and the stray closers a small model writes after it (`{"name": ..., "arguments":
    {}}}`, Qwen2.5-Coder-1.5B): they go with it, or a lone `}` stayed in the content beside the call, which agent
    frameworks keep in the history. Streamed, the value waits for the next character that is not one."""
    brackets = search if isinstance(search, Brackets) else Brackets(i)
    found = brackets.find(text)
    if found is not None:
        after = _STRAY_CLOSERS.match(text, found[1]).end()
        if after == len(text) and not final:
            return Region(i, len(text), "json", text, i, found[1], False, search=brackets)
        end = after if text[found[1]:after].strip() else found[1]
        return Region(i, end, "json", text, i, found[1], True)
    if final and brackets.in_string and len(text) - i <= MAX_REPAIR_CHARS:
        return _json_region_to_stray_quote(text, i)
    return Region(i, len(text), "json", text, i, len(text), final, search=brackets)


def _json_region_to_stray_quote(text: str, i: int) -> Region:
    """A final text whose last string never closes: its quote is read as a stray character, so the value may end
    before the text does (what whole-message repair has always done)."""
    depth = 0
    for m in BRACKETS.finditer(text, i):
        tok = m.group()
        if tok in "{[":
            depth += 1
        elif tok in "}]":
            depth -= 1
            if depth == 0:
                return Region(i, m.end(), "json", text, i, m.end(), True)
    return Region(i, len(text), "json", text, i, len(text), True)


def could_be_call(region: Region, arg_names: Collection[str] = ()) -> bool:
    """Early release for streaming: False once an unfinished region's start rules out a call (only its first
    `_HEADER_MAX` characters are looked at, so asking again as it grows costs nothing). `arg_names`: the offered
    tools' parameters, which a call with its arguments flattened may write before its name (`{"city": "Paris",
    "name": "get_weather"}`): repaired whole that was a call, and streamed it went out as text."""
    if region.kind == "code":
        return False
    window = min(region.body_end, region.body_start + _HEADER_MAX)
    if region.kind == "fence":
        m = _NON_SPACE.search(region.text, region.body_start, window)
        return (m is None and window == region.body_end) or (m is not None and m.group() in "{[")
    if region.kind != "json":
        return True
    m = _FIRST_KEY.match(region.text, region.body_start, window)
    if m is None:
        return region.text[region.body_start:window].strip() in ("", "[")
    key, after = m.group(3), m.group(4)
    if not after:  # key still being written
        return any(k.startswith(key) for k in (*_CALL_KEYS, *arg_names))
    return key in _CALL_KEYS or key in arg_names


def raw_calls(region: Region) -> list[RawCall]:
    """Calls written in a complete region (no name check yet); [] when it holds none."""
    if region.kind == "mistral":
        return _mistral_calls(region.body)
    if region.kind == "function":
        return [_with_args(region.name, region.body)]
    if region.kind == "json":  # one balanced value found in prose
        return _json_calls(region.body)
    return _json_calls(region.body, several=True)  # a block may hold several calls, however separated


def _mistral_calls(body: str) -> list[RawCall]:
    """Mistral v3 writes a JSON array after [TOOL_CALLS]; v11 writes `name[ARGS]{...}`, repeated."""
    if not _MISTRAL_V11.match(body):
        return _json_calls(body, several=True)
    parts = re.split(r"\[TOOL_CALLS\]", body)
    calls = []
    for part in parts:
        m = _MISTRAL_V11.match(part)
        if m:
            calls.append(_with_args(m.group(1), part[m.end():]))
    return calls


def _with_args(name: str, args_text: str) -> RawCall:
    if not args_text.strip():
        return RawCall(name, {})
    try:
        parsed = parse_json(args_text)
    except Unrepairable:
        return RawCall(name, args_text.strip())
    return RawCall(name, parsed.value, parsed.fixes, parsed.text.strip())


def _json_calls(body: str, several: bool = False) -> list[RawCall]:
    if not body.strip():
        return []
    try:
        values = parse_json_values(body) if several else [parse_json(body)]
    except Unrepairable:
        return []
    calls = []
    for parsed in values:
        found = calls_from_value(parsed.value)
        for _, c in found:
            c.fixes[:0] = parsed.fixes
        if parsed.text:
            _keep_arguments_text(parsed.text, parsed.value, found)
        calls += [c for _, c in found]
    return calls


def _keep_arguments_text(text: str, value: Any, found: list[tuple[str | None, RawCall]]) -> None:
    """Sets each call's `text` to its arguments as written in `text` (the whole value's) where they are found for
    certain; a call left with "" has them written anew."""
    if len(found) == 1 and (only := _arguments_text(text, value, found[0][1].arguments)):
        found[0][1].text = only
    else:
        _arguments_texts_in_order(text, found)


def _arguments_text(text: str, value: Any, arguments: Any) -> str:
    """The text of `arguments` where `text` is the call `{"name": ..., "arguments": {...}}` (or an array of it alone,
    as Mistral writes it) that holds them as its last member, as chat templates and the engine's grammar write it;
    else "". `text` parsed whole, so the text after a `"arguments":` up to the call's closing brace is the arguments
    exactly when it parses alone: a key nested deeper leaves closers over, and no JSON string holds a bare quote.
    In C, so no longer than a second parse of the arguments: a scan of the call in Python doubled the cost of a
    14 KB `write_file`'s extraction (0.5 ms to 1.1 ms)."""
    call = value[0] if isinstance(value, list) and len(value) == 1 else value
    key = _args_key(call) if isinstance(call, dict) and isinstance(arguments, dict) else None
    if key is None or call[key] is not arguments:
        return ""
    body = text.strip()
    body = body[1:-1].strip() if body[0] == "[" else body
    end, quoted = len(body) - 1, f'"{key}"'
    at = body.rfind(quoted, 0, end)
    for _ in range(2):  # the last such key, else the one before it: the arguments may hold the key themselves
        if at < 0:
            break
        if colon := _MEMBER_OBJECT.match(body, at + len(quoted)):
            candidate = body[colon.end() - 1:end].rstrip()
            try:
                orjson.loads(candidate)
            except orjson.JSONDecodeError:
                pass
            else:
                return candidate
        at = body.rfind(quoted, 0, at)
    return ""


def _arguments_texts_in_order(text: str, found: list[tuple[str | None, RawCall]]) -> None:
    """The text of each call's arguments object, for calls in an array or with members after their arguments: the
    first `"arguments": {` (or another of ARG_KEYS) after the previous one's, read by the stdlib's raw_decode (C),
    which says where the object ends as it parses it (~0.5 us a small call; 31 us for 14 KB, where orjson takes 6).
    Kept where each is the call's own key and value and no such key follows the last, else all are written anew: no
    call's own key is inside another call's arguments, so any other found first (in another member's object, or a
    key written twice) takes a call's place and leaves that call's own key over, found in the next one's place or
    after the last."""
    spans, at = [], 0
    for key, raw in found:
        if key is None or not isinstance(raw.arguments, dict):
            continue  # flattened or a string: no object written as the arguments
        m = _ARGS_OBJECT.search(text, at)
        if m is None or m.group(1) != key:
            return
        try:
            value, at = _DECODER.raw_decode(text, m.end() - 1)
        except ValueError:
            return
        if value != raw.arguments:
            return
        spans.append((raw, m.end() - 1, at))
    if _ARGS_OBJECT.search(text, at) is None:
        for raw, start, end in spans:
            raw.text = text[start:end]


def calls_from_value(value: Any) -> list[tuple[str | None, RawCall]]:
    """Calls in the JSON shapes models use: {name, arguments|parameters|...}, OpenAI's {function: {...}},
    {tool_calls: [...]}, and lists of these; each with the key its arguments were read from (None: flattened)."""
    if isinstance(value, list):
        return [c for v in value for c in calls_from_value(v)]
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("tool_calls"), list):
        return calls_from_value(value["tool_calls"])
    if isinstance(value.get("function"), dict):
        return calls_from_value(value["function"])
    name = next((value[k] for k in NAME_KEYS if isinstance(value.get(k), str)), None)
    if name is None:
        return []
    args_key = _args_key(value)
    if args_key is not None:
        return [(args_key, RawCall(name, value[args_key]))]
    rest = {k: v for k, v in value.items() if k not in NAME_KEYS and k not in ("id", "type")}
    return [(None, RawCall(name, rest, ["flattened_arguments"] if rest else []))]


def _args_key(call: dict) -> str | None:
    return next((k for k in ARG_KEYS if k in call), None)
