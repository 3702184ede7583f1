"""Backend kinds by name. Each adapter module is imported only when a backend of its kind is configured, so
the engine (torch) loads only for `kind = "engine"`."""
from __future__ import annotations

import importlib

from .base import Backend, BackendConfig
from .errors import BadRequest
from .swaps import Swaps

KINDS = {"ollama": ("adapters.ollama", "OllamaBackend"), "llamacpp": ("adapters.llamacpp", "LlamaCppBackend"),
         "openai": ("adapters.openai_compat", "OpenAIBackend"), "engine": ("adapters.engine", "EngineBackend")}


def make_backend(cfg: BackendConfig, swaps: Swaps | None = None) -> Backend:
    """The backend's adapter; several urls make a `ReplicaSet` of one adapter per url; a llamacpp `model` makes a
    server Velo runs itself, swapped with the others through `swaps` (one per app)."""
    if cfg.kind == "llamacpp" and cfg.model:
        from .llamacpp_managed import ManagedLlamaCpp
        return ManagedLlamaCpp(cfg, swaps or Swaps())
    if len(cfg.urls) > 1:
        from .replicas import ReplicaSet
        return ReplicaSet.from_config(cfg, _make_one)
    return _make_one(cfg)


def _make_one(cfg: BackendConfig) -> Backend:
    if cfg.kind not in KINDS:
        raise BadRequest(f"backend {cfg.name!r}: unknown kind {cfg.kind!r} (expected one of {', '.join(KINDS)})")
    module, cls = KINDS[cfg.kind]
    return getattr(importlib.import_module(module), cls)(cfg)
