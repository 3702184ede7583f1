"""What outlives one configuration. Each config generation (proxy/generation.py) takes what it uses from one `Keep`
per app, by a key naming the settings it was built from; the next generation, if its settings for that thing did
not change, gets the very same object (a backend with its loaded model, a cache with its entries, a backend's
queue, counters), and the thing is closed only when the last generation holding it is closed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator, TypeVar

log = logging.getLogger("velo.keep")
T = TypeVar("T")
Close = Callable[[Any], Awaitable[None]]


def fingerprint(settings: Any) -> str:
    """A key for a settings dataclass (or any JSON-able value): equal settings, equal keys, whatever the key order
    in config.toml. A digest, not the settings: keys are logged, and settings hold passwords (a cache's
    `redis_url`, a backend's `api_key`), which a failed close wrote to the error log."""
    plain = dataclasses.asdict(settings) if dataclasses.is_dataclass(settings) else settings
    return hashlib.blake2b(json.dumps(plain, sort_keys=True, default=str).encode(), digest_size=12).hexdigest()


@dataclass
class Tally:
    """A count kept through config reloads by what each configuration makes anew (a coalescer, an embedding
    batcher): a counter of its own started again at 0 at every reload, and lost what the old one counted after."""

    n: int = 0


@dataclass(eq=False)
class _Held:
    value: Any
    close: Close | None
    users: int = 0


class Keep:
    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    def lease(self) -> "Lease":
        return Lease(self)


class Lease:
    """One generation's hold on kept things, given back all at once when the generation closes."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self.keys: list[str] = []

    def hold(self, key: str, make: Callable[[], T], close: Close | None = None) -> tuple[T, bool]:
        """(the thing kept under `key`, made now if nobody holds it; whether it was made now). A thing that must be
        opened asynchronously is kept as the task opening it, which every holder may await."""
        assert key not in self.keys, f"{key} held twice by one generation"
        held = self.keep._held.get(key)
        fresh = held is None
        if held is None:
            held = self.keep._held[key] = _Held(make(), close)
        held.users += 1
        self.keys.append(key)
        return held.value, fresh

    async def give_back(self) -> None:
        """Last taken, first given back (stage state before the backends it was built on); what no generation holds
        any more is closed."""
        for key, held in self._released():
            if held.close is not None:
                try:
                    await held.close(held.value)
                except Exception:  # noqa: BLE001 - one thing failing to close must not keep the rest open
                    log.exception("closing %s failed", key)

    def let_go(self) -> None:
        """A generation whose build failed gives back what it took. Building only makes things (opening them is
        `Generation.start`'s job), so nothing is closed: what it made alone is forgotten, what others hold keeps
        their count. Without this, a refused reload left its holds behind and a kept backend was never closed."""
        for _ in self._released():
            pass

    def _released(self) -> Iterator[tuple[str, _Held]]:
        """Each key let go of, last taken first, with what no generation holds any more (no longer kept)."""
        while self.keys:
            key = self.keys.pop()
            held = self.keep._held[key]
            held.users -= 1
            if held.users == 0:
                del self.keep._held[key]
                yield key, held
