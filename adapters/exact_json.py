"""JSON whose integers may pass 64 bits, read and written whole.

orjson reads an integer past 64 bits as a float (a tool call's `{"id": 12345678901234567890123}` went out as
`{"id":1.2345678901234568e22}`), refuses one past a double's range, and writes none (a TypeError, and a 500).
Python's json holds any integer, so it takes over only where such a number is: a cheap scan of the text on
reading, orjson's TypeError on writing; everything else stays orjson's.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable

import orjson

# Any integer orjson cannot hold has at least 20 digits, or 19 after a minus sign. The scan maps digits and "-" to
# "0" and all else to a space, then looks for a run of 20: ~1.3 us a KB (a regex took ~15), against orjson's ~0.4. It
# may also find digits in a string or a long fraction, which the stdlib then reads as orjson would.
_DIGITS = bytes(48 if 48 <= c < 58 or c == 45 else 32 for c in range(256))
_RUN = b"0" * 20
_NO = object()


def loads(text: str | bytes) -> Any:
    """orjson.loads, with each integer whole; raises orjson.JSONDecodeError where orjson does, but for a number
    past a double's range, which the stdlib reads."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        if "as double" not in str(e) or not _long_digits(text) or (exact := _stdlib_loads(text)) is _NO:
            raise
        return exact
    if not _long_digits(text):
        return value
    exact = _stdlib_loads(text)
    return value if exact is _NO else exact


def _long_digits(text: str | bytes) -> bool:
    return _RUN in (text.encode(errors="replace") if isinstance(text, str) else text).translate(_DIGITS)


def _stdlib_loads(text: str | bytes) -> Any:
    """The stdlib's reading held to orjson's rules (no NaN or Infinity, no number a double overflows), or _NO where
    it fails (those, or past its own 4,300 digits)."""
    try:
        return json.loads(text, parse_constant=_refuse, parse_float=_finite)
    except (ValueError, RecursionError):
        return _NO


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(digits: str) -> float:
    value = float(digits)
    if not math.isfinite(value):
        raise ValueError(f"{digits[:20]} is past a double's range")
    return value


def dumps(value: Any, option: int = 0, default: Callable[[Any], Any] | None = None) -> bytes:
    """orjson.dumps, with integers past 64 bits written whole (by the stdlib, in orjson's compact form)."""
    try:
        return orjson.dumps(value, default=default, option=option)
    except TypeError as e:
        if "64-bit" not in str(e):
            raise
    indent = 2 if option & orjson.OPT_INDENT_2 else None
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=(",", ": " if indent else ":"),
                      sort_keys=bool(option & orjson.OPT_SORT_KEYS), default=lambda v: _plain(v, default)).encode()


def _plain(value: Any, default: Callable[[Any], Any] | None) -> Any:
    """What orjson writes for a type the stdlib does not know: a dataclass as its fields, else `default`'s."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if default is None:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return default(value)
