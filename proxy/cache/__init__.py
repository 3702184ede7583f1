"""Velo's response cache: exact (memory, SQLite, Redis) and semantic (faiss, pgvector), scoped by tenant."""
from .config import CacheConfig, CacheConfigError
from .layer import CacheHit, CacheLayer
from .policy import RoutePolicy, bypass_requested

__all__ = ["CacheConfig", "CacheConfigError", "CacheHit", "CacheLayer", "RoutePolicy", "bypass_requested"]
