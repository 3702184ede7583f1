"""Where torch's OpenMP threads may live, and how many the engine's steps use.

libgomp gives every thread that runs a parallel region its own team of worker threads, and once a process
holds more such workers than it has cores it stops spinning between regions: each of the hundreds of small
ops in a decode step then pays a futex wake-up. One stray team (a model loaded on the caller's thread) made
the engine thread's decode step 36 -> 60 ms for SmolLM2-135M on 2 cores. So the engine thread is the only
long-lived thread with a team: one-off work such as loading runs in a thread that exits, and embeddings run
on the engine thread itself.

Every parallel region ends at a barrier, so a team is only as fast as its slowest thread: when another process
keeps a core busy, the worker on it is descheduled for whole time slices and every op waits for it. SmolLM2-135M
on 2 cores, decode step at batch 1 / 8: 20 / 35 ms on 2 threads on a quiet machine but 267 / 336 ms beside
other busy processes, where 1 thread takes 26-32 / 49 ms (OMP_WAIT_POLICY=PASSIVE: 32 / 49 ms busy, but 39 / 49
ms quiet). So ThreadBudget gives the steps as many threads as there are cores the rest of the machine leaves free.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import torch

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


class ThreadBudget:
    """OpenMP threads for the engine's next step: at most `max_threads`, no more than the cores other processes
    leave free over the last `interval` seconds (/proc/stat's busy time less this process's own). Where
    /proc/stat is missing (not Linux), always max_threads."""

    def __init__(self, max_threads: int, interval: float = 0.25, cores: int | None = None):
        self.max_threads, self.interval = max_threads, interval
        self.cores = cores or os.cpu_count() or 1
        self.threads = max_threads
        self._last = _sample()

    def restart(self) -> None:
        """Start a fresh interval (after the engine sat idle, what others did meanwhile says little about now)."""
        self._last = _sample()

    def apply(self) -> int:
        """Re-decide at most once an interval; set torch's thread count (this thread's team) when it changes."""
        now = _sample()
        if now is None or self._last is None or now[0] - self._last[0] < self.interval:
            return self.threads
        (t0, busy0, own0), (t1, busy1, own1) = self._last, now
        self._last = now
        wanted = self.for_others_busy(max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0))
        if wanted != self.threads:
            self.threads = wanted
            torch.set_num_threads(wanted)
        return self.threads

    def for_others_busy(self, others: float) -> int:
        """Threads when other processes keep `others` cores busy: a quarter core of theirs already costs one of
        ours, since a thread that loses its core stalls the whole team (1 thread loses a quarter on a quiet
        machine, 2 threads lose 10x beside a busy core)."""
        return max(1, min(self.max_threads, int(self.cores - others + 0.25)))


def _sample() -> tuple[float, float, float] | None:
    """(now, seconds the machine's CPUs were busy, seconds this process used), or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    busy = sum(fields[:8]) - sum(fields[3:5])  # user .. steal, less idle and iowait (guest time is in user)
    return time.monotonic(), busy / _TICKS, time.process_time()


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
