"""What is made from a JSON Schema (a validator, a verdict on it), kept per schema: clients send the same schema with
every request, and making it again costs more than using it. Kept under a digest, and only for schemas of a size
tools have: keyed by its bytes, a 1 MB schema pinned itself and what was made from it in each of 256 entries (a
bounded-state audit grew Velo by 1.2 GB with 300 such requests)."""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Callable, Generic, TypeVar

import orjson
import xxhash

from .exact_json import dumps

T = TypeVar("T")
MAX_KEPT_BYTES = 64 * 1024  # a large real tool schema is a few KB
INLINE_BYTES = 8 * 1024  # made on the loop up to here: llguidance compiles ~23 KB in 4 ms


class PerSchema(Generic[T]):
    def __init__(self, make: Callable[[Any], T], entries: int = 256) -> None:
        self.make, self.entries = make, entries
        self.kept: OrderedDict[bytes, T] = OrderedDict()

    def __call__(self, schema: Any) -> T:
        """`make(schema)`, from the kept ones where a schema of the same canonical JSON (sorted keys) was made."""
        raw, key = self._key(schema)
        if key in self.kept:
            return self._found(key)
        return self._keep(raw, key, self.make(schema))

    async def off_loop(self, schema: Any) -> T:
        """As a call, but a schema not kept and past INLINE_BYTES is made on a worker thread (a 268 KB one took
        llguidance 92 ms, which held the event loop; on a thread the loop waits 19 ms at most). What is kept is
        touched on the loop only."""
        raw, key = self._key(schema)
        if key in self.kept:
            return self._found(key)
        made = await asyncio.to_thread(self.make, schema) if len(raw) > INLINE_BYTES else self.make(schema)
        return self._keep(raw, key, made)

    @staticmethod
    def _key(schema: Any) -> tuple[bytes, bytes]:
        raw = dumps(schema, option=orjson.OPT_SORT_KEYS)
        return raw, xxhash.xxh3_128_digest(raw)

    def _found(self, key: bytes) -> T:
        self.kept.move_to_end(key)
        return self.kept[key]

    def _keep(self, raw: bytes, key: bytes, made: T) -> T:
        if len(raw) <= MAX_KEPT_BYTES:
            self.kept[key] = made
            if len(self.kept) > self.entries:
                self.kept.popitem(last=False)
        return made
