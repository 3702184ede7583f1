"""The last requests, for the dashboard (proxy/routes_ui.py): what each was (endpoint, model, backend, status,
timings, tokens, cache outcome; its prompt only when `[server] log_prompts`), and tokens/s and time to first token
over the last minutes, binned. Prometheus histograms give totals since start; a person watching wants "now".
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass

_KEEP = 500  # requests kept: at 10 a second, the last 50 s in full; the series covers older minutes by bin


@dataclass
class Finished:
    at: float  # wall clock, seconds
    endpoint: str
    model: str
    backend: str
    status: str
    latency_s: float
    ttft_s: float | None
    tokens: int
    tok_s: float | None  # decode speed after the first token
    cache: str = ""
    prompt: str = ""  # only with log_prompts
    tenant: str = ""  # whose request it is: shown to that key (or an admin), never on the page itself


@dataclass
class Bin:
    start: float
    requests: int = 0
    tokens: int = 0
    ttft_sum: float = 0.0
    ttft_n: int = 0


class Recent:
    def __init__(self, keep: int = _KEEP, bin_s: float = 10.0, window_s: float = 600.0) -> None:
        self.requests: deque[Finished] = deque(maxlen=keep)
        self.bin_s, self.bins = bin_s, deque(maxlen=int(window_s / bin_s))

    def add(self, done: Finished) -> None:
        self.requests.append(done)
        start = done.at - done.at % self.bin_s
        if not self.bins or self.bins[-1].start < start:
            self.bins.append(Bin(start))
        current = self.bins[-1]
        current.requests += 1
        current.tokens += done.tokens
        if done.ttft_s is not None:
            current.ttft_sum += done.ttft_s
            current.ttft_n += 1

    def last(self, n: int = 50, prompts: bool = True, viewer: str | None = None) -> list[dict]:
        """The newest first: only the `viewer` tenant's own (None: every one), as /velo/requests lists them (where
        any key may open the dashboard, a key's holder saw when, what model and how long every other key asked);
        their prompts only while `prompts` (log_prompts as it is now: turned off by a reload, the prompts kept from
        before stayed on the page)."""
        out = []
        for r in reversed(self.requests):
            if len(out) == n:
                break
            if viewer is not None and r.tenant != viewer:
                continue
            row = asdict(r)
            del row["tenant"]
            if not prompts:
                row["prompt"] = ""
            out.append(row)
        return out

    def series(self, now: float | None = None) -> dict[str, list]:
        """Per bin over the window, oldest first, empty bins included: tokens/s produced, mean TTFT, requests."""
        now = time.time() if now is None else now
        newest = now - now % self.bin_s
        count = self.bins.maxlen or 0
        by_start = {b.start: b for b in self.bins}
        starts = [newest - i * self.bin_s for i in range(count - 1, -1, -1)]
        found = [by_start.get(s) for s in starts]
        return {"t": starts, "bin_s": self.bin_s,
                "tok_s": [round(b.tokens / self.bin_s, 2) if b else 0 for b in found],
                "ttft_s": [round(b.ttft_sum / b.ttft_n, 4) if b and b.ttft_n else None for b in found],
                "requests": [b.requests if b else 0 for b in found]}
