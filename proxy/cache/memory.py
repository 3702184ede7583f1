"""In-process LRU bounded by bytes, with a TTL per entry. Plain Python: no I/O, safe on the event loop."""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


# Decoded objects hold more than their encoded bytes (300 cached answers of 200 tokens: 8.5 MiB encoded, 19.4 MiB
# held; a response's 500 small input items, each an entry: 5.6x), so an entry is counted as what it holds.
_HELD_PER_BYTE = 2.5
_HELD_PER_ENTRY = 256  # the key, the entry, its slot in the dict


def held_bytes(key: str, encoded: int) -> int:
    """What an entry of `encoded` bytes under `key` holds in memory, as its `size`."""
    return int(encoded * _HELD_PER_BYTE) + len(key) + _HELD_PER_ENTRY


@dataclass
class _Entry:
    value: Any
    size: int
    expires_at: float


@dataclass
class MemoryLRU:
    """`value` is kept as given (decoded chunks, so a hit skips decoding); `size` is what it holds (`held_bytes`)."""

    max_bytes: int
    clock: Callable[[], float] = time.time  # wall clock: expiry times are shared with disk and Redis
    bytes_used: int = 0
    _entries: OrderedDict[str, _Entry] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Any | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at <= self.clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: str, value: Any, size: int, ttl_s: float) -> bool:
        """False when one entry alone exceeds the bound: it would evict everything and still not fit."""
        if size > self.max_bytes:
            return False
        if key in self._entries:
            self._drop(key)
        self._entries[key] = _Entry(value, size, self.clock() + ttl_s)
        self.bytes_used += size
        while self.bytes_used > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def put_encoded(self, key: str, value: Any, encoded: int, ttl_s: float) -> bool:
        """`put` of a value decoded from `encoded` bytes, counted as what it holds (`held_bytes`): each caller passed
        that count itself, and one that passed the bytes alone (an entry read back from SQLite or Redis) let the
        bound be passed ~2.5 times over."""
        return self.put(key, value, held_bytes(key, encoded), ttl_s)

    def delete(self, key: str) -> bool:
        if key not in self._entries:
            return False
        self._drop(key)
        return True

    def _drop(self, key: str) -> None:
        self.bytes_used -= self._entries.pop(key).size
        assert self.bytes_used >= 0
