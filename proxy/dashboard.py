"""The dashboard's JSON snapshot, read from the very collectors /metrics renders (each stage registers its own), so
the page and Prometheus never disagree; plus what only a person needs: health, loaded models, recent requests.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

from prometheus_client import CollectorRegistry

Samples = dict[str, list[tuple[dict[str, str], float]]]


def samples(registries: Iterable[CollectorRegistry]) -> Samples:
    out: Samples = defaultdict(list)
    for registry in registries:
        for family in registry.collect():
            for s in family.samples:
                out[s.name].append((s.labels, s.value))
    return out


def by(found: Samples, name: str, label: str, **match: str) -> dict[str, float]:
    """`name`'s values summed per value of `label`, over the samples whose labels include `match`."""
    out: dict[str, float] = defaultdict(float)
    for labels, value in found.get(name, []):
        if all(labels.get(k) == v for k, v in match.items()):
            out[labels.get(label, "")] += value
    return dict(out)


@dataclass
class BackendView:
    name: str
    kind: str
    healthy: bool
    models: list[str]


def snapshot(found: Samples, backends: list[BackendView], generation: int, recent: list[dict],
             series: dict[str, list]) -> dict[str, Any]:
    return {"generation": generation, "backends": [_backend(found, b) for b in backends], "cache": _cache(found),
            "repairs": by(found, "velo_tool_repairs_total", "kind"),
            "limits": {"refused": by(found, "velo_rate_limited_total", "limit"),
                       "keys_in_flight": by(found, "velo_key_in_flight", "key")},
            "requests": _reached_a_model(found),
            "coalesced": sum(by(found, "velo_coalesced_total", "").values()),
            "series": series, "recent": recent}


def _reached_a_model(found: Samples) -> dict[str, float]:
    """Requests by status, of those that reached a model: velo_requests also counts what reached none (401s,
    listings, unknown routes: the dashboard's own favicon among them) under model=""."""
    every, edge = by(found, "velo_requests_total", "status"), by(found, "velo_requests_total", "status", model="")
    return {status: n - edge.get(status, 0) for status, n in every.items() if n > edge.get(status, 0)}


def _backend(found: Samples, b: BackendView) -> dict[str, Any]:
    one = {"backend": b.name}
    replicas = by(found, "velo_replica_up", "replica", **one)
    outstanding = by(found, "velo_replica_outstanding", "replica", **one)
    managed = next((labels for labels, _ in found.get("velo_managed_state", []) if labels.get("backend") == b.name),
                   None)
    return {"name": b.name, "kind": b.kind, "healthy": b.healthy, "models": b.models,
            "queue": _one(found, "velo_queue_depth", one), "in_flight": _one(found, "velo_in_flight", one),
            "slots": _one(found, "velo_backend_slots", one),
            "replicas": [{"name": r, "up": bool(up), "outstanding": outstanding.get(r, 0)}
                         for r, up in replicas.items()],
            "managed": {"model": managed["model"], "state": managed["state"],
                        "waiting": _one(found, "velo_managed_waiting", one),
                        "starts": _one(found, "velo_managed_starts_total", one),
                        "swaps": _one(found, "velo_managed_swaps_total", one),
                        "wait_s": _one(found, "velo_managed_wait_seconds_total", one)} if managed else None}


def _one(found: Samples, name: str, match: dict[str, str]) -> float:
    return sum(v for labels, v in found.get(name, []) if all(labels.get(k) == x for k, x in match.items()))


def _cache(found: Samples) -> dict[str, Any]:
    tiers: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for labels, value in found.get("velo_cache_events_total", []):
        tiers[labels["tier"]][labels["outcome"]] += value
    out = {}
    for tier, outcomes in tiers.items():
        asked = outcomes.get("hit", 0) + outcomes.get("miss", 0)
        out[tier] = {**outcomes, "hit_rate": round(outcomes.get("hit", 0) / asked, 3) if asked else None}
    return {"tiers": out, "size": by(found, "velo_cache_size", "what")}
