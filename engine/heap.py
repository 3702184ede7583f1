"""Memory a shut-down engine freed, given back to the system. glibc keeps freed heap in its arenas: each unload
and load of SmolLM2 (keep_alive, a config reload) left ~300 MB more resident (696 -> 1,051 -> 1,363 MB after three
cycles); `malloc_trim` returns it (325 -> 394 -> 397 MB)."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing kept to give back this way
        return None


def give_back() -> None:
    """Blocking (it walks the heap): call it off the event loop, after the last reference is gone."""
    trim = _trim()
    if trim is not None:
        trim(0)
