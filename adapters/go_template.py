"""Ollama's `template` on /api/generate (a client's override, or a preset's TEMPLATE), for backends that are not
Ollama: the prompt rendered from the Go template, then sent raw.

The part of Go's text/template that Ollama's model templates use: output of pipelines; `if` / `else if` / `else`,
`range` (with `$i, $v :=`, `else`, `break`, `continue`) and `with`, each to its `end`; variables (`$x := ...`,
`$x = ...`, `$`, `$x.Field`); fields; string, number and boolean literals; parenthesised calls and `|` pipes; Go's
truth (false, 0, "", empty lists are false); the functions `and or not eq ne lt le gt ge len index slice print
printf json` (Ollama adds `json`); comments and the `{{-` / `-}}` trim markers (ASCII white space only). A template
without `.Messages` ends at `{{ .Response }}`, as Ollama cuts it (template.go). Ollama's own shipped templates
(alpaca, gemma3, llama2, mistral, command-r, ...) render as Ollama renders them; anything else is a 400 naming
what it could not read, rather than a prompt silently rendered wrong.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import BadRequest
from .protocol import CompletionRequest

_SPACE = " \t\r\n"  # what Go's trim markers trim: ASCII white space only (a no-break space stays)
# A Go string ("..." with escapes, `...` raw), a parenthesis, a pipe, a declaration or assignment, or a word
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|`[^`]*`|[()|]|:=|=(?!=)|[^\s()|]+')
_NUMBER = re.compile(r"-?(\d+(\.\d*)?|\.\d+)")
# What one render may do: a template's actions and function calls (Ollama's shipped templates run a few hundred over a
# system prompt and a prompt), and the characters it writes or hands to functions, beyond its inputs' own
_MAX_STEPS = 10_000
_SPARE_CHARS = 1024 * 1024


def _fail(what: str) -> BadRequest:
    return BadRequest(f"template: {what}", param="template")


@dataclass
class _Node:
    kind: str  # "text" | "print" | "set" | "if" | "range" | "with" | "break" | "continue"
    arg: Any = None  # the text, or the pipeline (a list of commands, each a list of terms)
    body: list["_Node"] = field(default_factory=list)
    orelse: list["_Node"] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # variables the node declares ($i, $v) or sets
    declares: bool = True  # `:=` rather than `=`


def _lex(template: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", s) pieces with the trim markers applied to the neighbouring text. Each action's end
    is looked for once, from its start (a regex over 40 KB of unclosed `{{` took 27 s, the event loop held)."""
    pieces: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    while (start := template.find("{{", pos)) >= 0:
        inner = start + 2
        trim_before = template.startswith("-", inner) and template[inner + 1:inner + 2] in _SPACE
        body = inner + 2 if trim_before else inner
        lead = len(template[body:]) - len(template[body:].lstrip(_SPACE))
        if template.startswith("/*", body + lead):  # a comment, which may hold "}}"
            close = template.find("*/", body + lead + 2)
            end = -1 if close < 0 else template.find("}}", close + 2)
        else:
            end = template.find("}}", body)
        if end < 0:
            raise _fail("unclosed action")
        action = template[body:end]
        trim_after = action.endswith("-") and action[-2:-1] in _SPACE
        text = template[pos:start]
        text = text.lstrip(_SPACE) if trim_next else text
        pieces.append(("text", text.rstrip(_SPACE) if trim_before else text))
        pieces.append(("action", (action[:-1] if trim_after else action).strip(_SPACE)))
        pos, trim_next = end + 2, trim_after
    tail = template[pos:]
    pieces.append(("text", tail.lstrip(_SPACE) if trim_next else tail))
    return pieces


# -- parsing -------------------------------------------------------------------------------------------------------

def _parse(pieces: list[tuple[str, str]], i: int = 0, closers: tuple[str, ...] = ()) -> tuple[list[_Node], int, str]:
    """Nodes up to one of `closers` ("end", "else"); the index after it and the closing action's text."""
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
        word, rest = (text.split(None, 1) + [""])[:2]
        if word in ("end", "else") and word in closers:
            return nodes, i, text
        if word in ("if", "range", "with"):
            node, i = _branch(word, rest, pieces, i)
            nodes.append(node)
        elif word in ("break", "continue") and not rest:
            nodes.append(_Node(word))
        else:
            nodes.append(_statement(text))
    if closers:
        raise _fail("missing {{ end }}")
    return nodes, i, ""


def _branch(kind: str, arg: str, pieces: list[tuple[str, str]], i: int) -> tuple[_Node, int]:
    """An `if`, `range` or `with` from its body to its `end`; `else if X` nests an `if X` that shares that `end`."""
    node = _statement(arg, kind)
    node.body, i, closed = _parse(pieces, i, ("end", "else"))
    words = closed.split(None, 2)  # the rest as written: a literal's spaces are its own
    if words[0] == "else" and len(words) == 3 and words[1] in ("if", "with"):
        inner, i = _branch(words[1], words[2], pieces, i)
        node.orelse = [inner]
    elif words == ["else"]:
        node.orelse, i, _ = _parse(pieces, i, ("end",))
    elif words != ["end"]:
        raise _fail(f"unsupported action {{{{ {closed} }}}}")
    return node, i


def _statement(text: str, kind: str = "print") -> _Node:
    """A pipeline, maybe after `$x :=`, `$x =` or (in a range) `$i, $v :=`."""
    tokens = _TOKEN.findall(text)
    for op in (":=", "="):
        if op in tokens:
            at = tokens.index(op)
            names = [t.rstrip(",") for t in tokens[:at] if t != ","]
            if not names or not all(n.startswith("$") for n in names) or len(names) > (2 if kind == "range" else 1):
                raise _fail(f"unsupported action {{{{ {text} }}}}")
            node = _Node("set" if kind == "print" else kind, _pipeline(tokens[at + 1:], text), names=names,
                         declares=op == ":=")
            return node
    return _Node(kind, _pipeline(tokens, text))


def _pipeline(tokens: list[str], text: str) -> list[list[Any]]:
    """Commands separated by `|`, each a list of terms; a parenthesised pipeline is one term."""
    if not tokens:
        raise _fail(f"empty pipeline in {{{{ {text} }}}}")
    commands: list[list[Any]] = [[]]
    stack: list[list[list[Any]]] = []
    for token in tokens:
        if token == "(":
            stack.append(commands)
            commands = [[]]
        elif token == ")":
            if not stack:
                raise _fail(f"unexpected ) in {{{{ {text} }}}}")
            inner, commands = commands, stack.pop()
            commands[-1].append(("pipe", inner))
        elif token == "|":
            commands.append([])
        else:
            commands[-1].append(_term(token, text))
    if stack or not all(commands):
        raise _fail(f"unbalanced {{{{ {text} }}}}")
    return commands


def _term(token: str, text: str) -> tuple[str, Any]:
    if token.startswith('"'):
        try:
            value = json.loads(token)  # Go's escapes are JSON's, for what templates write
        except ValueError:
            raise _fail(f"unterminated or bad string {token}") from None
        return ("value", value)
    if token.startswith("`"):
        if len(token) < 2 or not token.endswith("`"):
            raise _fail(f"unterminated string {token}")
        return ("value", token[1:-1])
    if token in ("true", "false"):
        return ("value", token == "true")
    if token == "nil":
        return ("value", None)
    if _NUMBER.fullmatch(token):
        return ("value", float(token) if "." in token else int(token))
    if token.startswith((".", "$")):
        return ("field", token)
    if token in _FUNCS:
        return ("func", token)
    raise _fail(f"unsupported {token!r} in {{{{ {text} }}}}")


# -- evaluation ----------------------------------------------------------------------------------------------------

class _Break(Exception):
    pass


class _Continue(Exception):
    pass


@dataclass
class _Output:
    """What a render writes, and what it may still do. Nested ranges multiply: thirty `range $.Messages` over a
    system prompt and a prompt are 2**30 passes from a 0.9 KB body, and a variable printed into itself doubles at
    each; rendered on the event loop (for llama-server and OpenAI-compatible servers), one such request held every
    other for hours and took the machine's memory."""

    chars_left: int
    steps_left: int = _MAX_STEPS
    parts: list[str] = field(default_factory=list)

    def write(self, text: str) -> None:
        self.charge(len(text))
        self.parts.append(text)

    def charge(self, chars: int) -> None:
        self.chars_left -= chars
        if self.chars_left < 0:
            raise _fail("renders too much text (a range or a function over its own output?)")

    def step(self, steps: int = 1) -> None:
        self.steps_left -= steps
        if self.steps_left < 0:
            raise _fail(f"runs more than {_MAX_STEPS} actions and calls (ranges nested over each other?)")


@dataclass
class _Scope:
    dot: Any
    names: list[dict[str, Any]]  # variables, innermost last
    out: _Output

    def get(self, name: str) -> Any:
        for frame in reversed(self.names):
            if name in frame:
                return frame[name]
        raise _fail(f"undefined variable {name}")

    def assign(self, name: str, value: Any) -> None:
        for frame in reversed(self.names):
            if name in frame:
                frame[name] = value
                return
        raise _fail(f"undefined variable {name}")


def _truth(value: Any) -> bool:
    """Go's: false, 0, nil and empty strings, lists and maps are false."""
    return bool(value) if isinstance(value, (bool, int, float, str, list, dict, tuple)) else value is not None


def _field(path: str, scope: _Scope) -> Any:
    """`.`, `.A.B`, `$`, `$x`, `$x.A`, `$.A`: missing keys are the zero value (Ollama's missingkey=zero)."""
    if path.startswith("$"):
        name, _, rest = path.partition(".")
        value = scope.get(name)
    else:
        value, rest = scope.dot, path[1:]
    for part in filter(None, rest.split(".")):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _shown(value: Any) -> str:
    """A value printed as Go prints it."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + " ".join(_shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_shown(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, float):
        return f"{value:g}" if value == int(value) and abs(value) < 1e21 else repr(value)  # Go's 1.0 is "1"
    return str(value)


def _printf(form: str, *args: Any) -> str:
    """Go's printf for the verbs templates use: %s %v %d %q %%; any other (a width, %x, %.2f) is a 400, never text
    rendered otherwise than Go would."""
    values = iter(args)

    def verb(m: re.Match) -> str:
        if m.group(1) == "%":
            return "%"
        if m.group(1) is None:
            raise _fail(f"printf verb {m.group()!r} is not one Velo renders (%s %v %d %q)")
        value = next(values, None)
        return json.dumps(value, ensure_ascii=False) if m.group(1) == "q" else _shown(value)
    return re.sub(r"%([svdq%])|%[^svdq%]?", verb, form)


def _print(*values: Any) -> str:
    """Go's fmt.Sprint: a space between two operands when neither is a string."""
    out = []
    for i, v in enumerate(values):
        if i and not isinstance(v, str) and not isinstance(values[i - 1], str):
            out.append(" ")
        out.append(_shown(v))
    return "".join(out)


def _slice(value: Any, *bounds: int) -> Any:
    if not isinstance(value, (list, str)):
        raise _fail("slice of a value that is no list or string")
    if len(bounds) > 2:
        raise _fail("slice with a capacity")
    return value[bounds[0]:bounds[1]] if len(bounds) == 2 else value[bounds[0]:] if bounds else value


def _index(value: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(key, int) and key < 0:
            raise _fail(f"index {key} out of range")
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            raise _fail(f"index {key!r} out of range") from None
    return value


def _eq(first: Any, *others: Any) -> bool:
    if not others:
        raise _fail("eq: wants at least two arguments")
    return any(first == other for other in others)


def _compare(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def compare(a: Any, b: Any) -> bool:
        try:
            return op(a, b)
        except TypeError:
            raise _fail(f"incompatible types for comparison: {a!r}, {b!r}") from None
    return compare


def _length(value: Any) -> int:
    if not isinstance(value, (list, str, dict)):
        raise _fail("len of a value that has none")
    return len(value)


_WRITERS = ("print", "printf", "json")
_FUNCS: dict[str, Callable[..., Any]] = {
    "and": lambda *v: next((x for x in v if not _truth(x)), v[-1]),
    "or": lambda *v: next((x for x in v if _truth(x)), v[-1]),
    "not": lambda v: not _truth(v),
    "eq": _eq, "ne": lambda a, b: a != b,
    "lt": _compare(lambda a, b: a < b), "le": _compare(lambda a, b: a <= b),
    "gt": _compare(lambda a, b: a > b), "ge": _compare(lambda a, b: a >= b),
    "len": _length, "index": _index, "slice": _slice,
    "print": _print, "printf": _printf,
    "json": lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False),
}


def _value(commands: list[list[Any]], scope: _Scope) -> Any:
    """A pipeline's value: each command's result the last argument of the next."""
    result: Any = _NONE
    for command in commands:
        kind, first = command[0]
        if kind == "func" and first in ("and", "or") and result is _NONE:  # Go's short circuit: the rest unread
            result = _and_or(first == "and", command[1:], scope)
            continue
        args = [_operand(t, scope) for t in command[1:]] + ([] if result is _NONE else [result])
        scope.out.step(1 + len(args))
        if kind == "func":
            for arg in args:  # a string a function copies or compares, or a value it prints
                scope.out.charge(len(arg) if isinstance(arg, str) else len(_shown(arg)) if first in _WRITERS else 0)
            try:
                result = _FUNCS[first](*args)
            except (TypeError, IndexError, ValueError) as e:  # a count or a kind of argument it cannot take
                raise _fail(f"{first}: {e}") from None
        elif args:
            raise _fail("arguments given to what is not a function")
        else:
            result = _operand(command[0], scope)
    return result


_NONE = object()


def _and_or(is_and: bool, terms: list[Any], scope: _Scope) -> Any:
    """`and` gives its first false operand, `or` its first true one, else the last, each read only when needed."""
    if not terms:
        raise _fail(f"{'and' if is_and else 'or'}: wants at least one argument")
    for term in terms:
        value = _operand(term, scope)
        if _truth(value) != is_and:
            return value
    return value


def _operand(term: tuple[str, Any], scope: _Scope) -> Any:
    kind, value = term
    if kind == "value":
        return value
    if kind == "field":
        return _field(value, scope)
    if kind == "pipe":
        return _value(value, scope)
    raise _fail(f"{value} needs its arguments in parentheses here")


def _render(nodes: list[_Node], scope: _Scope) -> None:
    for n in nodes:
        scope.out.step()
        if n.kind == "text":
            scope.out.write(n.arg)
        elif n.kind == "print":
            scope.out.write(_shown(_value(n.arg, scope)))
        elif n.kind == "set":
            value = _value(n.arg, scope)
            if n.declares:
                scope.names[-1][n.names[0]] = value
            else:
                scope.assign(n.names[0], value)
        elif n.kind in ("break", "continue"):
            raise _Break() if n.kind == "break" else _Continue()
        elif n.kind in ("if", "with"):
            value = _value(n.arg, scope)
            held = _held(n, value, scope)  # `if $x := ...`: $x is the branches' own
            if _truth(value):
                _inner(n.body, scope, value if n.kind == "with" else scope.dot, held)
            else:
                _inner(n.orelse, scope, scope.dot, held)
        else:
            _range(n, scope)


def _held(n: _Node, value: Any, scope: _Scope) -> dict[str, Any]:
    """The variable an `if` or `with` declares for its branches ({}), or assigns where it was declared."""
    if not n.names:
        return {}
    if n.declares:
        return {n.names[0]: value}
    scope.assign(n.names[0], value)
    return {}


def _inner(nodes: list[_Node], scope: _Scope, dot: Any, names: dict[str, Any] | None = None) -> None:
    """A block: its own variables (Go's scoping), and `dot`."""
    _render(nodes, _Scope(dot, [*scope.names, names or {}], scope.out))


def _range(n: _Node, scope: _Scope) -> None:
    items = _value(n.arg, scope)
    if isinstance(items, dict):
        pairs = sorted(items.items())
    elif isinstance(items, list):
        pairs = list(enumerate(items))
    elif items is None:
        pairs = []
    else:  # a string: Go's "range can't iterate over"
        raise _fail(f"range can't iterate over {_shown(items)}")
    if not pairs:
        _inner(n.orelse, scope, scope.dot)
        return
    for key, item in pairs:
        names = dict(zip(n.names[::-1], (item, key)))  # `$v :=` is the element; `$i, $v :=` the index too
        try:
            _inner(n.body, scope, item, names)
        except _Continue:
            continue
        except _Break:
            break


def _before_response(nodes: list[_Node]) -> tuple[list[_Node], bool]:
    """The nodes up to `{{ .Response }}` (whether it was met): Ollama deletes every node after it from a template
    with no `.Messages` (template.go, Execute), so the prompt ends where the answer begins. Rendered whole, a
    legacy ChatML template closed the assistant's turn before the model wrote it."""
    kept: list[_Node] = []
    for n in nodes:
        if n.kind == "print" and n.arg == [[("field", ".Response")]]:
            return kept, True
        if n.kind in ("if", "range", "with"):
            body, cut_body = _before_response(n.body)
            orelse, cut_else = _before_response(n.orelse)
            kept.append(_Node(n.kind, n.arg, body, orelse, n.names, n.declares))
            if cut_body or cut_else:
                return kept, True
        else:
            kept.append(n)
    return kept, False


def render(template: str, prompt: str, system: str | None = None, suffix: str | None = None) -> str:
    """The prompt Ollama would build from `template` for one /api/generate request. With a suffix, as Ollama
    fills one in: the prompt and the suffix, no system prompt."""
    messages = [{"Role": role, "Content": text, "Thinking": "", "Images": [], "ToolCalls": []}  # Ollama's fields
                for role, text in ([("system", system)] if system else []) + [("user", prompt)]]
    values = {"Prompt": prompt, "System": "" if suffix else system or "", "Suffix": suffix or "", "Response": "",
              "Messages": [] if suffix else messages, "Tools": []}
    out = _Output(len(template) + 16 * sum(map(len, (prompt, system or "", suffix or ""))) + _SPARE_CHARS)
    try:
        nodes, _, _ = _parse(_lex(template))
        if not suffix and ".Messages" not in template:
            nodes, _ = _before_response(nodes)
        _render(nodes, _Scope(values, [{"$": values}], out))
    except (_Break, _Continue):
        raise _fail("break or continue outside a range") from None
    except RecursionError:  # actions or parentheses nested a thousand deep
        raise _fail("nested too deeply") from None
    return "".join(out.parts)


def render_request(req: CompletionRequest, lead: str = "") -> str:
    """A generate's prompt from the client's own `template` (set), with `lead` ahead of the prompt (llama-server's
    image markers): one place that says which of the request's fields fill the template, for every adapter."""
    assert req.template is not None
    return render(req.template, lead + req.prompt, req.system, req.suffix)
