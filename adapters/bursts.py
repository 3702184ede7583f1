"""A stream that never waits lets other tasks run now and then.

A cache hit's pieces, or an upstream's that arrived together, are there at once, and aiohttp's writes wait for
nothing while the socket takes the bytes: a 60,000-piece answer held the event loop from its first byte to its last
(47-62 ms; bench/loop_stalls.py). The pause belongs where the stream is made, not where it is written: a newer
autocomplete cancels the older one's task, and only a cancel that lands inside the pipeline's queue slot becomes the
dialect's "replaced" error; one that landed in the route's writer cut the stream short.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

BURST_S = 0.005  # the longest a stream runs without letting others run: ~5,000 pieces of a cached answer


@dataclass
class Burst:
    since: float = field(default_factory=time.monotonic)  # when this stream last let other tasks run

    async def pause(self) -> None:
        """Lets other tasks run if this stream has not for BURST_S."""
        if (now := time.monotonic()) - self.since > BURST_S:
            self.since = now
            await asyncio.sleep(0)
