"""The `[batching]` table of config.toml: coalescing, embedding micro-batches and per-backend queues."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


class BatchingConfigError(ValueError):
    """A bad `[batching]` table: the message names the key."""


@dataclass
class BatchingConfig:
    coalesce: bool = True  # identical in-flight deterministic requests share one backend call
    embed_window_ms: float = 5.0  # how long an embed call waits for company
    embed_max_inputs: int = 64  # a batch is sent as soon as it holds this many inputs
    max_queue: int = 256  # requests waiting per backend beyond its concurrency; more get 429 + Retry-After
    supersede_autocomplete: bool = True  # a newer FIM request from the same client cancels the older one

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: str = "batching") -> "BatchingConfig":
        known = {f.name for f in fields(cls)}
        for key, value in raw.items():
            if key not in known:
                raise BatchingConfigError(f"{path}.{key}: unknown key")
            default = getattr(cls, key)
            if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, (int, float)):
                raise BatchingConfigError(f"{path}.{key}: must be {type(default).__name__}")
        cfg = cls(**raw)
        if cfg.embed_window_ms < 0 or cfg.embed_max_inputs < 1 or cfg.max_queue < 0:
            raise BatchingConfigError(f"{path}: embed_window_ms and max_queue must be >= 0, embed_max_inputs >= 1")
        return cfg
