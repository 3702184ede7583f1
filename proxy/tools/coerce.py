"""Make arguments match their JSON Schema where the fix is certain, and say what still does not match.

Only lossless, unambiguous changes are made ("5" -> 5 for an integer, "true" -> true, a lone value -> a
one-element array, an enum value in the wrong case, a JSON string where an object is expected). Each change is
recorded as `path: old -> new`; anything else is left for the validator to report. Validation is jsonschema-rs
(about 1 us a call against 30 us for the pure-Python jsonschema, and it sits on every tool-calling answer), with
remote `$ref`s never fetched: a client's schema must not make the proxy open connections.
"""
from __future__ import annotations

import math
import re
import sys
from typing import Any

import jsonschema_rs
import orjson

from adapters.exact_json import dumps
from adapters.per_schema import PerSchema
from proxy.tools.repair import Unrepairable, parse_json

_INT = re.compile(r"\s*[-+]?\d+(\.0*)?\s*")
_NUM = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")
_BOOLS = {"true": True, "false": False}


def check_arguments(args: Any, schema: dict, changes: list[str]) -> tuple[Any, list[str]]:
    """Coerce `args` towards `schema` (appending to `changes`) and return them with the remaining errors."""
    if not schema:
        return args, [] if isinstance(args, dict) else ["arguments are not a JSON object"]
    if not validation_errors(args, schema):  # the usual case, and every coercion is a fix of an invalid value
        return args, []
    args = coerce(args, schema, schema, "", changes)
    return args, validation_errors(args, schema)


def usable(schema: dict) -> bool:
    """Whether `schema` can be checked against at all: a client's dangling or remote `$ref`, or `"type": 5`, cannot.
    What the model writes for one passes as written (`skipped=schema`), as Ollama, which checks no schema, passes it:
    reported as the model's error, every call to such a tool was a 502, which SDKs retried."""
    try:
        _validator(schema)
    except jsonschema_rs.ValidationError:
        return False
    return True


def validation_errors(value: Any, schema: dict) -> list[str]:
    try:
        validator = _validator(schema)
    except jsonschema_rs.ValidationError as e:
        return [f"the tool's schema cannot be used: {e.message}"]
    if validator.is_valid(value):
        return []
    return [_describe(e) for e in validator.iter_errors(value)]


def _new_validator(schema: dict) -> Any:
    """Building a validator costs more than using it, and clients send the same tools with every request."""
    return jsonschema_rs.validator_for(schema, retriever=_no_fetch)


_validator = PerSchema(_new_validator)


def _no_fetch(uri: str) -> Any:
    raise ValueError(f"remote $ref {uri} is not fetched")


def _describe(e: jsonschema_rs.ValidationError) -> str:
    where = "/".join(str(p) for p in e.instance_path)
    return f"{where or '(root)'}: {e.message}"


def coerce(value: Any, schema: Any, root: dict, path: str, changes: list[str]) -> Any:
    """Walk `value` along `schema` and return the coerced value; the input is never mutated."""
    if not isinstance(schema, dict):
        return value
    schema = _resolve(schema, root)
    types = _types(schema)
    if types:
        value = _coerce_type(value, types, path, changes)
    if "enum" in schema:
        value = _coerce_enum(value, schema["enum"], path, changes)
    if isinstance(value, dict):
        return _coerce_object(value, schema, root, path, changes)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [coerce(v, schema["items"], root, f"{path}[{i}]", changes) for i, v in enumerate(value)]
    for key in ("anyOf", "oneOf"):
        if key in schema and not _matches_any(value, schema[key], root):
            return _first_branch(value, schema[key], root, path, changes)
    return value


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else schema


def _types(schema: dict) -> list[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    return list(t) if isinstance(t, list) else []


def _coerce_type(value: Any, types: list[str], path: str, changes: list[str]) -> Any:
    if _is_type(value, types):
        return value
    for t in types:
        new = _convert(value, t)
        if new is not _NO:
            changes.append(f"{path or '(root)'}: {_show(value)} -> {_show(new)} ({t})")
            return new
    return value


_NO = object()


def _exact_int(digits: str) -> Any:
    """The integer the digits say, whole: through a float, "12345678901234567893" became ...168. Past 64 bits too,
    which adapters/exact_json.py writes (orjson wrote none, and 400 digits were a 500); not past the digits Python
    converts (sys.get_int_max_str_digits, 4,300), where int() and the writer both refuse."""
    if len(digits.lstrip("+-")) > (sys.get_int_max_str_digits() or math.inf):  # 0: no limit set
        return _NO
    return int(digits)


def _convert(value: Any, t: str) -> Any:
    if t == "integer":
        if isinstance(value, str) and _INT.fullmatch(value):
            return _exact_int(value.strip().partition(".")[0])
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif t == "number" and isinstance(value, str) and _NUM.fullmatch(value):
        if "." not in value and "e" not in value.lower():
            return _exact_int(value.strip())
        num = float(value)
        return num if math.isfinite(num) else _NO
    elif t == "boolean" and isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    elif t == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    elif t in ("object", "array") and isinstance(value, str):
        return _json_in_string(value, dict if t == "object" else list)
    elif t == "array" and value is not None:
        return [value]
    elif t == "null" and isinstance(value, str) and value.strip().lower() in ("null", "none"):
        return None
    return _NO


def _json_in_string(value: str, want: type) -> Any:
    text = value.strip()
    if not text or text[0] not in "{[":
        return [value] if want is list else _NO
    try:
        parsed = parse_json(text).value
    except Unrepairable:
        return _NO
    return parsed if isinstance(parsed, want) else _NO


def _is_type(value: Any, types: list[str]) -> bool:
    return any(_TYPE_CHECKS.get(t, lambda v: True)(value) for t in types)


_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _coerce_enum(value: Any, options: list, path: str, changes: list[str]) -> Any:
    if value in options or not isinstance(value, str):
        return value
    folded = [o for o in options if isinstance(o, str) and o.strip().lower() == value.strip().lower()]
    if len(folded) == 1:
        changes.append(f"{path or '(root)'}: {_show(value)} -> {_show(folded[0])} (enum)")
        return folded[0]
    return value


def _coerce_object(value: dict, schema: dict, root: dict, path: str, changes: list[str]) -> dict:
    props = schema.get("properties")
    if not isinstance(props, dict):
        return value
    patterns = [(p, s) for p, s in (schema.get("patternProperties") or {}).items() if isinstance(s, dict)]
    out = {}
    for key, v in value.items():
        where = f"{path}.{key}" if path else key
        if key in props:
            out[key] = coerce(v, props[key], root, where, changes)
        elif matched := next((s for p, s in patterns if _matches(p, key)), None):  # allowed by a pattern: kept
            out[key] = coerce(v, matched, root, where, changes)
        elif schema.get("additionalProperties") is False:
            changes.append(f"{where}: {_show(v)} dropped (not in the schema)")
        else:
            out[key] = v
    return out


def _matches(pattern: str, key: str) -> bool:
    """Whether a client's `patternProperties` pattern matches a key, as the validator reads it: its Rust regex
    runs in linear time, where Python's `re` could take seconds on a pattern such as `(a+)+$`."""
    return not validation_errors(key, {"type": "string", "pattern": pattern})


def _matches_any(value: Any, branches: list, root: dict) -> bool:
    return any(isinstance(b, dict) and _is_type(value, _types(_resolve(b, root)) or ["any"]) for b in branches)


def _first_branch(value: Any, branches: list, root: dict, path: str, changes: list[str]) -> Any:
    for b in branches:
        trial: list[str] = []
        new = coerce(value, b, root, path, trial)
        if trial and not validation_errors(new, _resolve(b, root) if isinstance(b, dict) else {}):
            changes.extend(trial)
            return new
    return value


def _show(value: Any) -> str:
    text = dumps(value, option=orjson.OPT_NON_STR_KEYS).decode() if value is not _NO else "?"
    return text if len(text) <= 40 else text[:37] + "..."
