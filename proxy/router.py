"""Which backend serves a model name: aliases, then explicit routes (exact, then glob), then whoever lists it,
then the default backend."""
from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from dataclasses import dataclass, replace

from adapters.base import Backend
from adapters.errors import ModelNotFound
from adapters.protocol import ModelInfo

from .config import Config

log = logging.getLogger("velo.router")


@dataclass(frozen=True)
class Target:
    backend: Backend
    model: str  # the name the backend knows the model by


class Router:
    def __init__(self, config: Config, backends: dict[str, Backend], listing_timeout: float = 3.0,
                 info_ttl_s: float = 30.0):
        self.config = config
        self.backends = backends
        self.listing_timeout = listing_timeout
        self.info_ttl_s = info_ttl_s
        self._listed: dict[str, str] = {}  # model name -> backend name, from the last listing
        self._info: dict[tuple[str, str], tuple[float, ModelInfo | None]] = {}  # (backend, model) -> (when, its info)

    async def model_info(self, target: Target) -> ModelInfo | None:
        """What the backend says about the model (context, capabilities), kept `info_ttl_s`: stages ask per
        request, and Ollama answers /api/show over HTTP. None when it cannot say (a model it serves without
        listing it, or a backend that is down): the request itself then finds out."""
        key, now = (target.backend.name, target.model), time.monotonic()
        cached = self._info.get(key)
        if cached is None or now - cached[0] > self.info_ttl_s:
            try:
                info = await asyncio.wait_for(target.backend.show(target.model), self.listing_timeout)
            except Exception as e:  # noqa: BLE001 - any failure here means "unknown", never a failed request
                log.debug("no model info for %s on %r: %s", target.model, target.backend.name, e)
                info = None
            cached = self._info[key] = (now, info)
        return cached[1]

    async def resolve(self, model: str) -> Target:
        if not model:
            raise ModelNotFound(model)
        alias = self.config.aliases.get(model)
        if alias is not None:
            backend, sep, name = alias.partition(":")
            if sep and backend in self.backends:
                return Target(self.backends[backend], name)
            model = alias
        target = self._routed(model)
        if target is None and model not in self._listed:
            await self.list_models()  # a model pulled since the last listing
        return target or self._from_listing(model) or self._default(model)

    def _routed(self, model: str) -> Target | None:
        for exact in (True, False):
            for route in self.config.routes:
                hit = route.match == model if exact else fnmatch.fnmatchcase(model, route.match)
                if hit:
                    return Target(self.backends[route.backend], route.model or model)
        return None

    def _from_listing(self, model: str) -> Target | None:
        for name in (model, _with_latest(model)):
            if name in self._listed:
                return Target(self.backends[self._listed[name]], name)
        return None

    def _default(self, model: str) -> Target:
        name = self.config.default_backend or (next(iter(self.backends)) if len(self.backends) == 1 else None)
        if name is None:
            raise ModelNotFound(model)
        return Target(self.backends[name], model)

    async def list_models(self) -> list[ModelInfo]:
        """The union of every backend's models (a backend that is down contributes nothing), plus aliases."""
        names = list(self.backends)
        results = await asyncio.gather(*(self._list_one(self.backends[n]) for n in names))
        seen: dict[str, ModelInfo] = {}
        for name, models in zip(names, results):
            for info in models:
                if info.name not in seen:
                    seen[info.name] = replace(info, backend=name)
        self._listed = {m.name: m.backend for m in seen.values()}
        for alias, target in self.config.aliases.items():
            base = seen.get(target.partition(":")[2] or target)
            seen.setdefault(alias, replace(base, name=alias) if base else ModelInfo(name=alias))
        return list(seen.values())

    async def _list_one(self, backend: Backend) -> list[ModelInfo]:
        try:
            return await asyncio.wait_for(backend.list_models(), self.listing_timeout)
        except Exception as e:  # noqa: BLE001 - one backend down must not hide the others' models
            log.warning("listing models of backend %r failed: %s", backend.name, e)
            return []


def _with_latest(model: str) -> str:
    """Ollama treats `name` and `name:latest` as the same model."""
    return model if ":" in model else f"{model}:latest"
