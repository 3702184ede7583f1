"""Typed config tables: dataclasses built from TOML with one error shape naming the key path, as llama-swap does.

Every config dataclass (proxy.config, proxy.cache.config, proxy.batching.config, adapters.base.BackendConfig,
adapters.replicas.ReplicaOptions, engine.EngineConfig) is built by `build`, which checks each key against the
field's type hint (str, int, float, bool, Literal, optionals, lists and dicts of those, nested dataclasses) and the
bounds in its metadata, then lets the dataclass's own `__post_init__` check what spans fields. `setting` declares
a field with its documentation, which proxy/config_example.py renders into config.example.toml.

pydantic would do the checking, but its errors and coercions (it turns "no" into False) are its own, and every
config class would have to become its model class, engine's included; this is ~100 lines with no dependency.
"""
from __future__ import annotations

import dataclasses
import math
import types
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")
_SCALARS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


class SchemaError(ValueError):
    """A bad config value; the message starts with the key path ("backends[0].options.kv_memory: ...")."""


def setting(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Any = dataclasses.MISSING,
            min: float | None = None, max: float | None = None, default_doc: str | None = None,
            secret: bool = False) -> Any:
    """A dataclass field with its documentation (`doc`, and `default_doc` where the default needs words) and
    inclusive bounds for numbers. A `secret` value (an API key) is never said in an error: errors are logged."""
    meta = {"doc": doc, "min": min, "max": max, "default_doc": default_doc, "secret": secret}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def build(cls: type[T], raw: Any, path: str) -> T:
    """`cls(**raw)` with every key and value checked; SchemaError naming the key path otherwise."""
    if not isinstance(raw, dict):
        raise SchemaError(f"{path}: must be a table")
    hints = get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    values = {}
    for key, value in raw.items():
        if key not in known:
            raise SchemaError(f"{_join(path, key)}: unknown key (expected one of: {', '.join(known)})")
        values[key] = _convert(value, hints[key], _join(path, key), known[key].metadata)
    if missing := [n for n, f in known.items() if n not in values and _required(f)]:
        raise SchemaError(f"{_join(path, missing[0])}: required")
    try:
        return cls(**values)
    except (ValueError, TypeError) as e:  # __post_init__ checks; "field: why" names its field
        field, sep, why = str(e).partition(": ")
        if sep and field in known:
            raise SchemaError(f"{_join(path, field)}: {why}") from e
        raise SchemaError(f"{path}: {e}" if path else str(e)) from e


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]


def _convert(value: Any, hint: Any, path: str, meta: Any = None) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        return _union(value, args, path, meta)
    if origin is Literal:
        if value not in args:
            raise SchemaError(f"{path}: must be one of {', '.join(repr(a) for a in args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        return build(hint, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise SchemaError(f"{path}: must be an array")
        return [_convert(v, args[0], f"{path}[{i}]", meta) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: must be a table")
        return {k: _convert(v, args[1], _join(path, k), meta) for k, v in value.items()}
    if hint in _SCALARS:
        return _bounded(_scalar(value, hint, path, bool((meta or {}).get("secret"))), path, meta)
    raise SchemaError(f"{path}: cannot be set from a config file")


def _union(value: Any, args: tuple, path: str, meta: Any) -> Any:
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in (a for a in args if a is not type(None)):
        try:
            return _convert(value, arg, path, meta)
        except SchemaError as e:
            errors.append(str(e).removeprefix(f"{path}: "))
    raise SchemaError(f"{path}: " + " or ".join(dict.fromkeys(errors)))


def _scalar(value: Any, kind: type, path: str, secret: bool = False) -> Any:
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and ok and math.isnan(value):  # TOML's `nan` passed every bound: a nan timeout 500ed each request
        raise SchemaError(f"{path}: must be a number, got nan")
    if not ok:
        raise SchemaError(f"{path}: must be {_SCALARS[kind]}, got {type(value).__name__}"
                          + ("" if secret else f" {value!r}"))
    return value


def _bounded(value: Any, path: str, meta: Any) -> Any:
    lo, hi = (meta or {}).get("min"), (meta or {}).get("max")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f">= {lo:g}" if hi is None else f"<= {hi:g}" if lo is None else f"between {lo:g} and {hi:g}"
            raise SchemaError(f"{path}: must be {bounds}, got {value}")
    return value
