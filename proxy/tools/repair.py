"""Turn the almost-JSON small models write into JSON, and say what was fixed.

Three steps, cheapest first: valid JSON parses with orjson untouched; the usual breakages (trailing or doubled
commas, single quotes, unquoted keys, Python/JS literals, comments, missing commas, truncated output, stray text
after the value, raw control characters in strings) are fixed by one regex-tokenizer pass that costs a few
microseconds; anything stranger goes to the `json-repair` library. The fast pass exists because json-repair is a
char-by-char parser (50-500 us for one call) and repair sits on every tool-calling response.

Hard limits keep every step linear in the text and short: text over `MAX_REPAIR_CHARS` is only parsed, never
repaired; json-repair sees at most `MAX_LIBRARY_CHARS` nested at most `MAX_DEPTH` deep (it is superlinear in
nesting: 1,000 `{` took 0.35 s, 32,768 took 10.8 s, 2 MB froze the proxy for minutes). Work moved to a thread
(proxy/tools/budget.py) checks its deadline in the fast pass as it goes.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import json_repair
import orjson

from adapters.exact_json import loads
from adapters.fields import MAX_DEPTH, nests_deeper
from proxy.tools.budget import check_budget

from .quote import placed_quote

MAX_REPAIR_CHARS = 256 * 1024  # the fast pass: ~1 us a character, so at most ~0.3 s of a thread
MAX_LIBRARY_CHARS = 16 * 1024  # json-repair: 10-40 ms for 16 KB of ordinary broken JSON on this machine
_CHECK_EVERY = 4096  # fast-pass tokens between deadline checks

_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<dq>"(?:[^"\\]|\\.)*(?:"|\Z))
    |(?P<sq>'(?:[^'\\]|\\.)*(?:'|\Z))
    |(?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z)|\#[^\n]*)
    |(?P<num>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<word>[A-Za-z_$][\w$]*)
    |(?P<open>[{\[(])
    |(?P<close>[}\])])
    |(?P<colon>:)
    |(?P<comma>,)
    |(?P<other>.)""",
    re.S | re.X,
)
_LITERALS = {"true": "true", "false": "false", "null": "null", "none": "null"}
_NON_JSON = {"nan": "null", "infinity": "null", "undefined": "null"}
_CLOSER = {"{": "}", "[": "]", "(": "]"}
_CONTROL = re.compile(r"[\x00-\x1f]")
_JSON_START = re.compile(r"[{\[]")
_SURROGATE = re.compile("[\ud800-\udfff]")
BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]]', re.S)  # a JSON string (whole) or a bracket
# A string that runs to the end of the text is a truncation only if it swallowed no structure: `"units}}]` is a
# missing closing quote, whose value the fast pass cannot know (80.8% of such texts came out silently wrong).
_STRUCTURE = re.compile(r'["{}\[\]]|,\s*"|:\s*["{\[]')
_SWALLOWED = re.compile(r'"\s*[:,]')  # a quote then a colon or comma, left inside a repaired string: a key eaten


class Unrepairable(ValueError):
    """No JSON value could be recovered without inventing one."""


@dataclass
class Repaired:
    value: Any
    fixes: list[str] = field(default_factory=list)
    text: str = ""  # what was parsed, where it needed no repair: the value as written (ToolCall.text)


def parse_json(text: str) -> Repaired:
    """Parse `text` (an object or array, possibly broken) into a value; `fixes` names each repair made."""
    try:
        value = loads(text)
    except orjson.JSONDecodeError:
        pass
    else:
        if nests_deeper(value):
            raise Unrepairable(f"the value nests deeper than {MAX_DEPTH} levels")
        return Repaired(value, text=text)
    if len(text) > MAX_REPAIR_CHARS:
        raise Unrepairable(f"{len(text)} characters are more than repair takes ({MAX_REPAIR_CHARS})")
    fixes: list[str] = []
    fixed = _fast_repair(text, fixes)
    if fixed is not None:
        try:
            value = loads(fixed)
        except orjson.JSONDecodeError:
            pass
        else:
            if nests_deeper(value):
                raise Unrepairable(f"the value nests deeper than {MAX_DEPTH} levels")
            return Repaired(value, list(dict.fromkeys(fixes)))
    return _library_repair(text)


def parse_json_values(text: str) -> list[Repaired]:
    """Every JSON value written one after another in `text` (several calls in one `<tool_call>` block or fence,
    separated by newlines, commas or nothing), in order; a value that cannot be recovered is left out.
    Raises Unrepairable when none can."""
    spans = _top_level_spans(text)
    if len(spans) <= 1:
        return [parse_json(text)]
    values = []
    for span in spans:
        try:
            values.append(parse_json(span))
        except Unrepairable:
            continue
    if not values:
        raise Unrepairable("no JSON value could be recovered")
    return values


def _top_level_spans(text: str) -> list[str]:
    """The bracketed values at depth 0, by a scan that skips double-quoted strings; an unclosed last value runs
    to the end of the text."""
    spans, depth, start = [], 0, -1
    for m in BRACKETS.finditer(text):
        tok = m.group()
        if tok in "{[":
            if depth == 0:
                start = m.start()
            depth += 1
        elif tok in "}]" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start:m.end()])
    if depth > 0:
        spans.append(text[start:])
    return spans


def decode_arguments(raw: Any, fixes: list[str]) -> Any:
    """Arguments may come as an object, a JSON string, or a JSON string inside a JSON string."""
    for _ in range(3):
        if not isinstance(raw, str):
            return raw
        stripped = raw.strip()
        if not stripped:
            fixes.append("empty_arguments")
            return {}
        if stripped[0] == '"':  # a JSON string literal around the arguments
            try:
                raw = orjson.loads(stripped)
            except orjson.JSONDecodeError:
                return raw
            fixes.append("double_encoded")
            continue
        if stripped[0] not in "{[":
            return raw
        try:
            parsed = parse_json(stripped)
        except Unrepairable:
            return raw
        fixes += ["double_encoded", *parsed.fixes]
        raw = parsed.value
    return raw


def _library_repair(text: str) -> Repaired:
    start = _JSON_START.search(text)
    if start is None:
        raise Unrepairable("no JSON object or array found")
    if len(text) > MAX_LIBRARY_CHARS:
        raise Unrepairable(f"{len(text)} characters of broken JSON are more than repair takes ({MAX_LIBRARY_CHARS})")
    if _bracket_depth(text) > MAX_DEPTH:
        raise Unrepairable(f"the text nests deeper than {MAX_DEPTH} levels")
    check_budget()
    try:
        value = json_repair.repair_json(text[start.start():], return_objects=True, skip_json_loads=True)
    except (ValueError, RecursionError) as e:  # the library's own limits
        raise Unrepairable(f"json-repair gave up: {e}") from e
    if nests_deeper(value):
        raise Unrepairable(f"the value nests deeper than {MAX_DEPTH} levels")
    if not isinstance(value, (dict, list)):
        raise Unrepairable("text is not repairable into a JSON object or array")
    if any(_SWALLOWED.search(s) for s in _strings(value)):
        placed = placed_quote(text[start.start():].rstrip())
        if placed is None:
            raise Unrepairable("a string swallowed the keys after it (a missing quote the repair could not place)")
        return Repaired(_cleaned(placed), ["missing_quote"])
    return Repaired(_cleaned(value), ["json_repair"])


def _bracket_depth(text: str) -> int:
    """The deepest bracket nesting outside double-quoted strings (one linear scan)."""
    depth = deepest = 0
    for m in BRACKETS.finditer(text):
        tok = m.group()
        if tok in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif tok in "}]":
            depth = max(0, depth - 1)
    return deepest


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _cleaned(value: Any) -> Any:
    """json-repair keeps NaN/Infinity, which are not JSON: null, as the fast pass does; and it decodes a lone
    surrogate escape ("\\ud83d") into a string no JSON encoder writes: U+FFFD, as a UTF-8 decoder would. An integer
    past 64 bits stays whole (adapters/exact_json.py writes it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return _no_lone_surrogates(value)
    if isinstance(value, dict):
        return {_no_lone_surrogates(k): _cleaned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    return value


def _no_lone_surrogates(text: str) -> str:
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


@dataclass
class _Writer:
    """State of the single fast pass: output pieces, open brackets, and what the next token should be."""

    out: list[str] = field(default_factory=list)
    stack: list[str] = field(default_factory=list)
    prev: str = ""  # "open" | "key" | "colon" | "value" | "comma"
    key_at: int = -1  # index in `out` where the pending object key starts (to drop it if truncated)

    def expecting_key(self) -> bool:
        return bool(self.stack) and self.stack[-1] == "{" and self.prev in ("open", "comma")


def _fast_repair(text: str, fixes: list[str]) -> str | None:
    """One tokenizer pass that rewrites common breakages into JSON; None when it meets anything else."""
    w = _Writer()
    for n, m in enumerate(_TOKEN.finditer(text, _first_bracket(text, fixes))):
        if n % _CHECK_EVERY == 0:
            check_budget()
        kind, tok = m.lastgroup, m.group()
        if kind == "ws":
            continue
        if kind == "comment":
            fixes.append("comments")
            continue
        if not w.stack and w.prev == "value":
            fixes.append("stray_text")
            break
        if not _step(w, kind, tok, fixes):
            return None
    return _finish(w, fixes)


def _first_bracket(text: str, fixes: list[str]) -> int:
    m = _JSON_START.search(text)
    if m is None:
        return len(text)
    if text[: m.start()].strip():
        fixes.append("stray_text")
    return m.start()


def _step(w: _Writer, kind: str, tok: str, fixes: list[str]) -> bool:
    if kind == "open":
        return _open(w, tok, fixes)
    if kind == "close":
        return _close(w, tok, fixes)
    if kind == "colon":
        if w.prev != "key":
            return False
        w.out.append(":")
        w.prev = "colon"
        return True
    if kind == "comma":
        if w.prev in ("comma", "open"):
            fixes.append("extra_comma")
        elif w.prev == "value":
            w.out.append(",")
            w.prev = "comma"
        else:
            return False
        return True
    return _scalar(w, kind, tok, fixes)


def _open(w: _Writer, tok: str, fixes: list[str]) -> bool:
    _comma_if_needed(w, fixes)
    if w.expecting_key() or w.prev == "key":
        return False
    if tok == "(":
        fixes.append("python_tuple")
    if len(w.stack) >= MAX_DEPTH:
        return False
    w.out.append("{" if tok == "{" else "[")
    w.stack.append(tok)
    w.prev = "open"
    return True


def _close(w: _Writer, tok: str, fixes: list[str]) -> bool:
    want = "[" if tok == ")" else {"}": "{", "]": "["}[tok]
    if want not in [b if b != "(" else "[" for b in w.stack]:
        fixes.append("stray_bracket")
        return True
    if w.prev in ("colon", "key"):
        return False
    if w.prev == "comma":
        w.out.pop()
        fixes.append("trailing_comma")
    while True:
        opened = w.stack.pop()
        w.out.append(_CLOSER[opened])
        if (opened if opened != "(" else "[") == want:
            break
        fixes.append("mismatched_bracket")
    w.prev = "value"
    return True


def _scalar(w: _Writer, kind: str, tok: str, fixes: list[str]) -> bool:
    if kind == "other" or not w.stack:
        return False
    as_key = w.expecting_key()
    if not as_key and w.prev == "value":
        _comma_if_needed(w, fixes)
        as_key = w.expecting_key()
    if w.prev == "key":
        return False
    if as_key:
        return _key(w, kind, tok, fixes)
    value = _value(kind, tok, fixes)
    if value is None:
        return False
    w.out.append(value)
    w.prev = "value"
    return True


def _key(w: _Writer, kind: str, tok: str, fixes: list[str]) -> bool:
    if kind == "word":
        fixes.append("unquoted_keys")
        key = f'"{tok}"'
    elif kind in ("dq", "sq"):
        key = _string(kind, tok, fixes)
        if key is None:
            return False
    else:
        return False
    w.key_at = len(w.out)
    w.out.append(key)
    w.prev = "key"
    return True


def _value(kind: str, tok: str, fixes: list[str]) -> str | None:
    if kind in ("dq", "sq"):
        return _string(kind, tok, fixes)
    if kind == "num":
        if tok.startswith(".") or tok.startswith("-.") or tok.endswith("."):
            fixes.append("number_format")
            return repr(float(tok))
        return tok
    lower = tok.lower()
    if lower in _LITERALS:
        if tok != lower or lower == "none":
            fixes.append("python_literals")
        return _LITERALS[lower]
    if lower in _NON_JSON:
        fixes.append("non_json_literal")
        return _NON_JSON[lower]
    return None


def _string(kind: str, tok: str, fixes: list[str]) -> str | None:
    """The string as JSON, or None when it is unclosed and swallowed structure (a guess the library makes)."""
    quote = tok[0]
    closed = len(tok) > 1 and tok[-1] == quote and not _escaped_end(tok)
    body = tok[1:-1] if closed else tok[1:]
    if not closed:
        if _STRUCTURE.search(body):
            return None
        fixes.append("truncated")
        if body.endswith("\\"):
            body = body[:-1]
    if kind == "sq":
        fixes.append("single_quotes")
        body = body.replace("\\'", "'")
        body = re.sub(r'(?<!\\)((?:\\\\)*)"', r'\1\\"', body)
    elif "\\'" in body:
        body = body.replace("\\'", "'")
        fixes.append("invalid_escape")
    if _CONTROL.search(body):
        fixes.append("control_chars")
        body = _CONTROL.sub(lambda m: orjson.dumps(m.group()).decode()[1:-1], body)
    return f'"{body}"'


def _escaped_end(tok: str) -> bool:
    """True when the final quote is itself escaped (an odd run of backslashes before it)."""
    run = len(tok) - 1 - len(tok[:-1].rstrip("\\"))
    return run % 2 == 1


def _comma_if_needed(w: _Writer, fixes: list[str]) -> None:
    if w.stack and w.prev == "value":
        fixes.append("missing_comma")
        w.out.append(",")
        w.prev = "comma"


def _finish(w: _Writer, fixes: list[str]) -> str | None:
    if not w.out:
        return None
    if w.stack:
        fixes.append("truncated")
        if w.prev == "comma":
            w.out.pop()
        elif w.prev in ("key", "colon"):
            del w.out[w.key_at:]
            if w.out and w.out[-1] == ",":
                w.out.pop()
        w.out.extend(_CLOSER[b] for b in reversed(w.stack))
    return "".join(w.out)
