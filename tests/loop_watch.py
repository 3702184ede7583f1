"""How long the event loop was held while something ran: the gaps between the turns of a timer task beside it."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable


async def loop_gaps(work: Awaitable[Any], every: float = 0.005) -> tuple[Any, list[float]]:
    """`work`'s result, and the gaps (seconds) between the turns of a task that sleeps `every` seconds (0: a turn of
    the loop) while it runs; the task ticks before the work starts, so a first step that blocks is seen too."""
    gaps: list[float] = [0.0]
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(every)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    try:
        return await work, gaps
    finally:
        done.set()
        await ticker
