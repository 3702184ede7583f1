"""Typed reads from a client's JSON body, raising BadRequest that names the field, so every dialect (and the
options table, adapters/options.py) validates alike; the checks every JSON value from outside shares; and a
server's reported numbers, read leniently."""
from __future__ import annotations

import math
from typing import Any

from .errors import BadRequest

_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
          dict: "an object"}


def body_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


# Integers are read whole (adapters/exact_json.py): none past 64 bits is taken, nor float() of one past 1024 bits
_WHOLE = {int: (-2**63, 2**64, 64), float: (-2**1023, 2**1024, 1024)}


def get(body: dict[str, Any], key: str, kind: type, default: Any = None, *, required: bool = False) -> Any:
    """`body[key]` checked against `kind` (int accepted for float; bool never taken for a number)."""
    value = body.get(key)
    if value is None:
        if required:
            raise BadRequest(f"{key} is required", param=key)
        return default
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if type(value) is int and kind in _WHOLE and not _WHOLE[kind][0] <= value < _WHOLE[kind][1]:
        raise BadRequest(f"{key} is out of range: an integer past {_WHOLE[kind][2]} bits", param=key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise BadRequest(f"{key} must be {_NAMES.get(kind, kind.__name__)}, got {type(value).__name__}", param=key)
    return value


# Longer than any name a server gives (Ollama's host, namespace, model and tag together stay under ~600): a name is
# kept in the model info and cache keys of what was asked, where a 100 KB one pinned 100 KB.
MAX_MODEL_NAME = 1024


def get_model(body: dict[str, Any], key: str = "model") -> str:
    model = get(body, key, str, required=True)
    if not model.strip():
        raise BadRequest(f"{key} is required", param=key)
    if len(model) > MAX_MODEL_NAME:
        raise BadRequest(f"{key}: a model name is at most {MAX_MODEL_NAME} characters, this one has {len(model)}",
                         param=key)
    return model


def string_list(body: dict[str, Any], key: str) -> list[str]:
    """A string or a list of strings (OpenAI `stop`, Ollama `stop`, embedding `input`)."""
    value = body.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise BadRequest(f"{key} must be a string or an array of strings", param=key)


# Deepest nesting of arrays and objects Velo takes from a client or a model: JSON Schemas of real tools nest under
# 20 levels, while orjson refuses to write past 254 and Python's recursion limit is hit near 300 in recursive
# walkers (seen: 500s from bodies nested 256-1000 deep).
MAX_DEPTH = 64


def nests_deeper(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True when `value` holds arrays/objects more than `limit` levels deep; iterative, so any depth is safe."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) is not dict and type(node) is not list:
            continue
        if depth > limit:
            return True
        for item in node.values() if type(node) is dict else node:
            if type(item) is dict or type(item) is list:
                stack.append((item, depth + 1))
    return False


def wire_text(value: Any) -> str:
    """A text field of a backend's answer: absent is "", anything but a string is the backend's mistake (the
    adapters' parsing turns the TypeError into a 502, adapters/http.py)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def reported(obj: Any, key: str, default: Any = 0) -> Any:
    """A count, duration or timing a server reports (`obj[key]`): a finite number, else `default`. A null or a string
    there is an odd server, not a reason to lose its answer: such a value reached arithmetic later, a 500, and in an
    embedding batch a request that never got an answer."""
    value = obj.get(key) if isinstance(obj, dict) else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if ok else default


def count(obj: Any, key: str, default: Any = 0) -> Any:
    """A token count or a duration in nanoseconds a server reports, as an int, else `default` (see `reported`)."""
    value = reported(obj, key, None)
    return default if value is None else int(value)
