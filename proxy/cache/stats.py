"""Counters and latency histograms for the cache; `snapshot()` is what `CacheLayer.stats()` returns."""
from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

# Upper bounds in seconds, Prometheus style (the last bucket is +Inf).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds
        self.n += 1

    def snapshot(self) -> dict:
        return {"buckets": list(LATENCY_BUCKETS), "counts": list(self.counts), "sum": self.total, "count": self.n}


@dataclass
class CacheStats:
    """`events[(tier, route, outcome)]`: tier is memory|sqlite|redis|semantic|pgvector|all, outcome
    hit|miss|bypass|store|skip."""

    events: Counter = field(default_factory=Counter)
    latency: dict[str, Histogram] = field(default_factory=dict)

    def count(self, tier: str, route: str, outcome: str) -> None:
        self.events[(tier, route, outcome)] += 1

    def observe(self, kind: str, seconds: float) -> None:
        self.latency.setdefault(kind, Histogram()).observe(seconds)

    def total(self, tier: str, outcome: str) -> int:
        return sum(n for (t, _, o), n in self.events.items() if t == tier and o == outcome)

    def snapshot(self, bytes_used: dict[str, int]) -> dict:
        by_tier: dict[str, dict[str, dict[str, int]]] = {}
        for (tier, route, outcome), n in self.events.items():
            by_tier.setdefault(tier, {}).setdefault(route, {})[outcome] = n
        return {"events": by_tier, "bytes": bytes_used,
                "latency": {k: h.snapshot() for k, h in self.latency.items()}}
