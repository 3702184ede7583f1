"""Velo's response cache: exact (memory, SQLite, Redis) and semantic (faiss, pgvector), scoped by tenant."""
from .config import CacheConfig
from .layer import CacheHit, CacheLayer
from .policy import RoutePolicy, bypass_requested

__all__ = ["CacheConfig", "CacheHit", "CacheLayer", "RoutePolicy", "bypass_requested"]
