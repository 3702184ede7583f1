"""Ollama's `keep_alive`: how long a model stays loaded after a request, read as Ollama's `api.Duration` reads it
(api/types.go, UnmarshalJSON): a number is seconds, a string is a Go duration ("5m", "1h30m", "0"), anything
negative means forever; a string Go cannot parse is a 400 with Go's own wording."""
from __future__ import annotations

import math
import re
from typing import Any

from .errors import BadRequest

DEFAULT_S = 300.0  # Ollama's default: 5 minutes
FOREVER = math.inf
_LONGEST_S = 2**63 / 1e9  # Go's time.Duration, in seconds
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# JSON values as Go's encoding/json decodes them into `any`, named as Ollama's error names them (reflect.TypeOf)
_GO_TYPES = {bool: "bool", dict: "map[string]interface {}", list: "[]interface {}"}
# A number ([0-9]*, then "." and [0-9]*) and its unit: every character up to the next digit or ".", as Go reads it
_PIECE = re.compile(r"([0-9]*)(\.[0-9]*)?([^0-9.]*)")


def go_duration(text: str) -> float:
    """Seconds of a Go duration string, read as time.ParseDuration reads it; ValueError in Go's words when it is not
    one ("1d" is `time: unknown unit "d" in duration "1d"`)."""
    sign, rest = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text.removeprefix("+"))
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f'time: invalid duration "{text}"')
    total = 0.0
    while rest:
        piece = _PIECE.match(rest)
        assert piece is not None  # each of its parts may be empty: it always matches
        whole, fraction, unit = piece.groups()
        if not whole and len(fraction or "") < 2:  # no digit: "abc", ".s"
            raise ValueError(f'time: invalid duration "{text}"')
        if not unit:
            raise ValueError(f'time: missing unit in duration "{text}"')
        if unit not in _UNITS:
            raise ValueError(f'time: unknown unit "{unit}" in duration "{text}"')
        total += float(f"{whole or 0}{fraction or ''}") * _UNITS[unit]
        rest = rest[piece.end():]
    return sign * total


def seconds(value: Any) -> float:
    """How long to keep the model after this request: the default when unset, FOREVER when negative."""
    if value is None:
        return DEFAULT_S
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadRequest(f"Unsupported type: '{_GO_TYPES.get(type(value), type(value).__name__)}'", param="keep_alive")
    if isinstance(value, str):
        try:
            value = go_duration(value)
        except ValueError as exc:
            raise BadRequest(str(exc), param="keep_alive") from exc
    # past Go's longest duration (292 years) is for good too: 1e300 made every later /api/ps a 500 (its expiry date)
    return FOREVER if value < 0 or value >= _LONGEST_S else float(value)


def unloads(value: Any) -> bool:
    """`keep_alive: 0` (or "0s", ...): unload the model once this request is done."""
    return value is not None and seconds(value) == 0
