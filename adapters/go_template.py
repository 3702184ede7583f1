"""Ollama's `template` override on /api/generate, for backends that are not Ollama: the prompt rendered from the
Go template the client sent, then sent raw.

A subset of Go's text/template, the part Ollama's model templates use: fields (`{{ .Prompt }}`, `{{ .System }}`,
`{{ .Suffix }}`, `{{ .Response }}`, `{{ $.System }}`), `if` / `else if` / `else` / `end` on a field, `not`, `eq` and
`ne` against a string, `range .Messages` with `.Role` and `.Content`, and the `{{-` / `-}}` trim markers. Anything
else is a 400 naming the action, rather than a prompt silently rendered wrong.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from .errors import BadRequest

_ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)


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
        text = text.lstrip() if trim_next else text
        pieces.append(("text", text.rstrip() if m.group(1) else text))
        pieces.append(("action", m.group(2)))
        pos, trim_next = m.end(), bool(m.group(3))
    tail = template[pos:]
    pieces.append(("text", tail.lstrip() if trim_next else tail))
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
        word = text.split(" ", 1)[0]
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
    words = shlex.split(expr)
    if not words:
        raise BadRequest("template: empty condition", param="template")
    if words[0] == "not" and len(words) == 2:
        return not _value(words[1], dot, root)
    if words[0] in ("eq", "ne") and len(words) == 3:
        same = str(_value(words[1], dot, root)) == words[2]
        return same if words[0] == "eq" else not same
    if len(words) == 1 and words[0].startswith((".", "$.")):
        scope, name = (root, words[0][2:]) if words[0].startswith("$.") else (dot, words[0][1:])
        return scope.get(name, "")
    raise BadRequest(f"template: unsupported expression {expr!r}", param="template")


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
            out.append("".join(_render(n.body, item, root) for item in items) if items
                       else _render(n.orelse, dot, root))
    return "".join(out)


def render(template: str, prompt: str, system: str | None = None, suffix: str | None = None) -> str:
    """The prompt Ollama would build from `template` for one /api/generate request."""
    messages = ([{"Role": "system", "Content": system}] if system else []) + [{"Role": "user", "Content": prompt}]
    values = {"Prompt": prompt, "System": system or "", "Suffix": suffix or "", "Response": "",
              "Messages": [] if suffix else messages}
    nodes, _, _ = _parse(_lex(template))
    return _render(nodes, values, values)
