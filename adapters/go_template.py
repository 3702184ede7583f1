"""Ollama's `template` override on /api/generate, for backends that are not Ollama: the prompt rendered from the
Go template the client sent, then sent raw.

A subset of Go's text/template, the part Ollama's model templates use: fields (`{{ .Prompt }}`, `{{ .System }}`,
`{{ .Suffix }}`, `{{ .Response }}`, `{{ $.System }}`), `if` / `else if` / `else` / `end` on a field, `not`, `eq` and
`ne` between fields and string literals, `range .Messages` with `.Role` and `.Content`, comments and the `{{-` /
`-}}` trim markers; a template without `.Messages` ends at `{{ .Response }}`, as Ollama cuts it. Anything else
(variables, `printf`, `slice`, `continue`: about half of Ollama's own templates) is a 400 naming the action, rather
than a prompt silently rendered wrong.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import BadRequest

_ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)
_SPACE = " \t\r\n"  # what Go's trim markers trim: ASCII white space only (a no-break space stays)


@dataclass
class _Node:
    kind: str  # "text" | "field" | "if" | "range"
    arg: str = ""
    body: list["_Node"] = field(default_factory=list)
    orelse: list["_Node"] = field(default_factory=list)


def _lex(template: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", s) pieces with the trim markers applied to the neighbouring text."""
    pieces: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for m in _ACTION.finditer(template):
        text = template[pos:m.start()]
        text = text.lstrip(_SPACE) if trim_next else text
        pieces.append(("text", text.rstrip(_SPACE) if m.group(1) else text))
        pieces.append(("action", m.group(2)))
        pos, trim_next = m.end(), bool(m.group(3))
    tail = template[pos:]
    pieces.append(("text", tail.lstrip(_SPACE) if trim_next else tail))
    return pieces


def _parse(pieces: list[tuple[str, str]], i: int = 0, closers: tuple[str, ...] = ()) -> tuple[list[_Node], int, str]:
    """Nodes up to one of `closers` ("end", "else"); the index after it and which closer it was."""
    nodes: list[_Node] = []
    while i < len(pieces):
        kind, text = pieces[i]
        i += 1
        if kind == "text":
            if text:
                nodes.append(_Node("text", text))
            continue
        if text.startswith("/*") and text.endswith("*/"):  # a comment
            continue
        word = text.split(None, 1)[0] if text else ""
        text = " ".join(text.split()) if word in ("if", "else", "range") else text  # `if` then a newline, a tab
        if word in ("end", "else") and word in closers:
            return nodes, i, text
        if word in ("if", "range"):
            node, i = _branch(word, text[len(word):].strip(), pieces, i)
            nodes.append(node)
        elif text.startswith((".", "$.")):
            nodes.append(_Node("field", text))
        else:
            raise BadRequest(f"template: unsupported action {{{{ {text} }}}}", param="template")
    if closers:
        raise BadRequest("template: missing {{ end }}", param="template")
    return nodes, i, ""


def _branch(kind: str, arg: str, pieces: list[tuple[str, str]], i: int) -> tuple[_Node, int]:
    """An `if` or `range` from its body to its `end`; `else if X` nests an `if X` that shares that `end`."""
    node = _Node(kind, arg)
    node.body, i, closed = _parse(pieces, i, ("end", "else"))
    if closed.startswith("else if "):
        inner, i = _branch("if", closed.removeprefix("else if ").strip(), pieces, i)
        node.orelse = [inner]
    elif closed == "else":
        node.orelse, i, _ = _parse(pieces, i, ("end",))
    return node, i


def _value(expr: str, dot: dict[str, Any], root: dict[str, Any]) -> Any:
    words = _WORD.findall(expr)
    if not words:
        raise BadRequest("template: empty condition", param="template")
    if words[0] == "not" and len(words) == 2:
        return not _term(words[1], dot, root)
    if words[0] in ("eq", "ne") and len(words) == 3:  # each side a field or a literal: `user` and "a\n" too
        same = _term(words[1], dot, root) == _term(words[2], dot, root)
        return same if words[0] == "eq" else not same
    if len(words) == 1:
        return _term(words[0], dot, root)
    raise BadRequest(f"template: unsupported expression {expr!r}", param="template")


# A Go string literal ("..." with escapes, `...` raw), or any other run of non-space
_WORD = re.compile(r'"(?:\\.|[^"\\])*"|`[^`]*`|\S+')


def _term(word: str, dot: dict[str, Any], root: dict[str, Any]) -> Any:
    """A field (`.Role`, `$.System`) or a string literal, as Go reads it."""
    if word.startswith((".", "$.")):
        scope, name = (root, word[2:]) if word.startswith("$.") else (dot, word[1:])
        return scope.get(name, "")
    if word.startswith("`") and word.endswith("`") and len(word) > 1:
        return word[1:-1]
    if word.startswith('"'):
        try:
            value = json.loads(word)  # Go's escapes are JSON's, for what templates write
        except ValueError:
            raise BadRequest(f"template: unterminated or bad string {word}", param="template") from None
        if isinstance(value, str):
            return value
    raise BadRequest(f"template: unsupported term {word!r}", param="template")


def _render(nodes: list[_Node], dot: dict[str, Any], root: dict[str, Any]) -> str:
    out = []
    for n in nodes:
        if n.kind == "text":
            out.append(n.arg)
        elif n.kind == "field":
            out.append(str(_value(n.arg, dot, root)))
        elif n.kind == "if":
            out.append(_render(n.body if _value(n.arg, dot, root) else n.orelse, dot, root))
        else:
            items = _value(n.arg, dot, root) or []
            if not isinstance(items, list):  # a string: Go's "range can't iterate over" (an AttributeError, a 500)
                raise BadRequest(f"template: range can't iterate over {n.arg}", param="template")
            out.append("".join(_render(n.body, item, root) for item in items) if items
                       else _render(n.orelse, dot, root))
    return "".join(out)


def _before_response(nodes: list[_Node]) -> tuple[list[_Node], bool]:
    """The nodes up to `{{ .Response }}` (whether it was met): Ollama deletes every node after it from a template
    with no `.Messages` (template.go, Execute), so the prompt ends where the answer begins. Rendered whole, a
    legacy ChatML template closed the assistant's turn before the model wrote it."""
    kept: list[_Node] = []
    for n in nodes:
        if n.kind == "field" and n.arg in (".Response", "$.Response"):
            return kept, True
        if n.kind in ("if", "range"):
            body, cut_body = _before_response(n.body)
            orelse, cut_else = _before_response(n.orelse)
            kept.append(_Node(n.kind, n.arg, body, orelse))
            if cut_body or cut_else:
                return kept, True
        else:
            kept.append(n)
    return kept, False


def render(template: str, prompt: str, system: str | None = None, suffix: str | None = None) -> str:
    """The prompt Ollama would build from `template` for one /api/generate request. With a suffix, as Ollama
    fills one in: the prompt and the suffix, no system prompt."""
    messages = ([{"Role": "system", "Content": system}] if system else []) + [{"Role": "user", "Content": prompt}]
    values = {"Prompt": prompt, "System": "" if suffix else system or "", "Suffix": suffix or "", "Response": "",
              "Messages": [] if suffix else messages}
    nodes, _, _ = _parse(_lex(template))
    if not suffix and ".Messages" not in template:
        nodes, _ = _before_response(nodes)
    return _render(nodes, values, values)
