"""The one place a missing closing quote can go, when there is exactly one.

`["ada@example.com], "subject": "Hi"` is a string that swallowed the `], ` after it: json-repair reads it as a
list of two strings (valid, and wrong), so repair refuses it. Putting the quote back before the structure it
swallowed is no guess when the quote fits in one place only: exactly one insertion point makes the whole text
strict JSON. Anything else (two quotes missing, or two places that both parse) stays refused.
"""
from __future__ import annotations

import re
from typing import Any

import orjson

from adapters.exact_json import loads

# Where a string could have ended: a character that is not a quote, then closing brackets and a comma or the end.
_ENDS = re.compile(r'(?<=[^"\s\\])(?=[\]}]*\s*(?:,\s*"|[\]}]\s*$))')
_MAX_CHARS = 4096  # every candidate costs one strict parse: 32 parses of 4 KB take ~0.1 ms
_MAX_CANDIDATES = 32


def placed_quote(text: str) -> Any | None:
    """The value `text` holds with one closing quote put back, or None unless exactly one place works."""
    if len(text) > _MAX_CHARS:
        return None
    found: list[Any] = []
    for n, m in enumerate(_ENDS.finditer(text)):
        if n == _MAX_CANDIDATES:
            return None
        try:
            found.append(loads(text[:m.start()] + '"' + text[m.start():]))
        except orjson.JSONDecodeError:
            continue
        if len(found) > 1:
            return None
    return found[0] if found else None
