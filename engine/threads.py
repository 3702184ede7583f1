"""Where torch's OpenMP threads may live.

libgomp gives every thread that runs a parallel region its own team of worker threads, and once a process
holds more such workers than it has cores it stops spinning between regions: each of the hundreds of small
ops in a decode step then pays a futex wake-up. One stray team (a model loaded on the caller's thread) made
the engine thread's decode step 36 -> 60 ms for SmolLM2-135M on 2 cores. So the engine thread is the only
long-lived thread with a team: one-off work such as loading runs in a thread that exits, and embeddings run
on the engine thread itself.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_passing_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a new thread that ends with it, taking its OpenMP team along; re-raises."""
    result: list = []

    def run() -> None:
        try:
            result.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # handed to the caller below
            result.append((False, exc))

    thread = threading.Thread(target=run, name="velo-passing")
    thread.start()
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value
