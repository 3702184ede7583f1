"""`replaced`: `dataclasses.replace` for the copies every request makes on its way (the resolve stage's settled
request and options, the stream asked of a backend, the caller named with its id). `replace` reads each field
through a loop in Python and calls `__init__` with them all (~3.5 us for a ChatRequest): the five copies of a short
chat request took 2.8% of its instructions in Velo (2,383 -> 2,316 thousand, callgrind, against the zero-work fake)."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

D = TypeVar("D")


def replaced(obj: D, **changes: Any) -> D:
    """What `dataclasses.replace(obj, **changes)` returns, made without calling `__init__` where that only stores
    its arguments: the same fields with the same values. Anything else (a field `__init__` does not take, a value
    kept beside the fields) goes through `replace` itself."""
    state, names = obj.__dict__, _stored(type(obj))
    if names is None or len(state) != len(names) or not changes.keys() <= names:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    copy = object.__new__(type(obj))
    copy.__dict__.update(state)
    copy.__dict__.update(changes)
    return copy


@functools.cache
def _stored(cls: type) -> frozenset[str] | None:
    """The field names of a dataclass whose generated `__init__` stores each argument and does nothing else (no
    `__post_init__`, no InitVar, ClassVar or `init=False` field, no slots); None for any other class."""
    own = vars(cls)
    if "__dataclass_fields__" not in own or not own["__dataclass_params__"].init or "__slots__" in own \
            or hasattr(cls, "__post_init__") or cls.__new__ is not object.__new__:
        return None
    fields = dataclasses.fields(cls)
    if len(fields) != len(own["__dataclass_fields__"]) or not all(f.init for f in fields):
        return None
    return frozenset(f.name for f in fields)
