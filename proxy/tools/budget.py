"""Repair work that may be heavy runs on a thread with a deadline, so no model answer can stall the event loop.

Small work (a usual tool call: a few hundred characters, ~50 us) stays on the loop: the hop to a thread costs more.
Larger work goes to one of the repair stage's two threads and checks its deadline as it goes (`check_budget`, at
every region and every few thousand tokens); past it, the work stops with `OverBudget` and the caller passes the
answer through unrepaired, saying so in `X-Velo-Repair`. The caller waits for the thread to stop, so no state is
touched by work still running; a caller that is cancelled (its client left) stops waiting at once, and its work
runs on to its deadline at most, on state no one reads any more.
"""
from __future__ import annotations

import asyncio
import contextvars
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, TypeVar

T = TypeVar("T")
INLINE_CHARS = 2048  # up to this much text, repair runs on the event loop (worst case measured: ~2 ms)
_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("velo_repair_deadline", default=float("inf"))


class OverBudget(Exception):
    """Repair ran past its time budget."""


def check_budget() -> None:
    if time.monotonic() > _deadline.get():
        raise OverBudget()


@dataclass
class Budget:
    """The time one answer's repair may spend on repair threads (every attempt and chunk together), and the
    threads it runs on (the repair stage's, shared by all answers)."""

    seconds: float
    pool: ThreadPoolExecutor

    @property
    def spent(self) -> bool:
        """Whether the time is all used: work that met the deadline stopped there (X-Velo-Repair: skipped=budget),
        and the answer went out as it came, where with time left, or threads free, it is repaired."""
        return self.seconds <= 0

    async def run(self, fn: Callable[..., T], *args: object, size: int) -> T:
        """`fn(*args)`: on the loop when `size` (characters of text to look at) is small, else on a repair thread
        with what is left of the budget (`fn` gets OverBudget from `check_budget` past it; waiting for a free
        thread counts)."""
        if size <= INLINE_CHARS:
            return fn(*args)
        started = time.monotonic()
        deadline = started + self.seconds

        def bounded() -> T:
            _deadline.set(deadline)
            return fn(*args)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, contextvars.copy_context().run,
                                                                    bounded)
        finally:
            self.seconds -= time.monotonic() - started


def repair_threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(2, "velo-repair")
