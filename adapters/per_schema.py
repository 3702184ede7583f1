"""What is made from a JSON Schema (a validator, a verdict on it), kept per schema: clients send the same schema with
every request, and making it again costs more than using it. Kept under a digest, and only for schemas of a size
tools have: keyed by its bytes, a 1 MB schema pinned itself and what was made from it in each of 256 entries (a
bounded-state audit grew Velo by 1.2 GB with 300 such requests)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Generic, TypeVar

import orjson
import xxhash

T = TypeVar("T")
MAX_KEPT_BYTES = 64 * 1024  # a large real tool schema is a few KB


class PerSchema(Generic[T]):
    def __init__(self, make: Callable[[Any], T], entries: int = 256) -> None:
        self.make, self.entries = make, entries
        self.kept: OrderedDict[bytes, T] = OrderedDict()

    def __call__(self, schema: Any) -> T:
        """`make(schema)`, from the kept ones where a schema of the same canonical JSON (sorted keys) was made."""
        raw = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        if len(raw) > MAX_KEPT_BYTES:
            return self.make(schema)
        key = xxhash.xxh3_128_digest(raw)
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key]
        made = self.kept[key] = self.make(schema)  # raising, it keeps nothing
        if len(self.kept) > self.entries:
            self.kept.popitem(last=False)
        return made
