"""Outputs from the engine thread to the asyncio callers, one wake-up of their event loop per step.

`loop.call_soon_threadsafe` writes to the loop's self-pipe every time (~10 us). Called once per sequence per
step, it took 4.4 of a 23 ms step at 256 sequences (a 1-layer model on 2 CPU cores, the engine's host work alone);
a step's outputs for one loop now go over in one call.
"""
from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any


class Mailbox:
    """What the engine thread posted for one event loop's queues, handed over together."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        # held weakly: _MAILBOXES is keyed weakly by the loop, and a mailbox holding it kept every loop that ever
        # called generate() alive, closed, with what was posted to it (asyncio.run per call: +3 KB a call)
        self._loop, self._lock = weakref.ref(loop), threading.Lock()
        self._pending: list[tuple[asyncio.Queue, Any]] = []
        self._scheduled = False

    def post(self, queue: asyncio.Queue, item: Any) -> None:
        """From any thread; raises RuntimeError once the loop is closed or gone (nobody is listening any more)."""
        with self._lock:
            self._pending.append((queue, item))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            loop = self._loop()
            if loop is None:
                raise RuntimeError("event loop is gone")
            loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            with self._lock:  # nothing will deliver them
                self._pending, self._scheduled = [], False
            raise

    def _deliver(self) -> None:
        with self._lock:
            batch, self._pending, self._scheduled = self._pending, [], False
        for queue, item in batch:
            queue.put_nowait(item)


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = weakref.WeakKeyDictionary()
_MAILBOXES_LOCK = threading.Lock()


def mailbox_for(loop: asyncio.AbstractEventLoop) -> Mailbox:
    with _MAILBOXES_LOCK:
        box = _MAILBOXES.get(loop)
        if box is None:
            box = _MAILBOXES[loop] = Mailbox(loop)
        return box
