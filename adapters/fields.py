"""Typed reads from a client's JSON body, raising BadRequest that names the field, so every dialect (and the
options table, adapters/options.py) validates alike."""
from __future__ import annotations

from typing import Any

from .errors import BadRequest

_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
          dict: "an object"}


def body_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def get(body: dict[str, Any], key: str, kind: type, default: Any = None, *, required: bool = False) -> Any:
    """`body[key]` checked against `kind` (int accepted for float; bool never taken for a number)."""
    value = body.get(key)
    if value is None:
        if required:
            raise BadRequest(f"{key} is required", param=key)
        return default
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise BadRequest(f"{key} must be {_NAMES.get(kind, kind.__name__)}, got {type(value).__name__}", param=key)
    return value


def get_model(body: dict[str, Any], key: str = "model") -> str:
    model = get(body, key, str, required=True)
    if not model.strip():
        raise BadRequest(f"{key} is required", param=key)
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
