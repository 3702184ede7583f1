"""Which backend serves a model name: a preset's base (proxy/presets.py) in its place, then aliases, then explicit
routes (exact, then glob), then whoever lists it, then the default backend. Listings come from memory
(proxy/listings.py), so no request waits on a backend that hangs, and a name nobody serves is a fast 404."""
from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from adapters.base import Backend
from adapters.errors import BackendUnavailable, ModelNotFound, VeloError
from adapters.fields import MAX_MODEL_NAME
from adapters.protocol import ModelInfo

from .config import Config
from .dialects.ollama_names import same_model
from .listings import START_S, Listings
from .presets import PresetStore, by_spelling, spellings

log = logging.getLogger("velo.router")
OTHER = "other"  # the metrics label of every model name that no backend lists and no route or alias names

# Models whose info is kept: far more than a server has, while made-up names sent to a default backend (each a 404
# from its /api/show) grew the dict by ~380 B each, without bound (9,000 in an audit's soak).
_INFO_ENTRIES = 1024


@dataclass(frozen=True)
class Target:
    backend: Backend
    model: str  # the name the backend knows the model by
    label: str = OTHER  # the name /metrics may show: bounded by what backends list and the config names

    @property
    def served(self) -> str:
        """The backend and its name for the model, as a key names what answers: NUL between them, which no name
        holds ("/", in many model names, let two pairs read as one)."""
        return f"{self.backend.name}\0{self.model}"


@dataclass
class _Info:
    at: float
    info: ModelInfo | None
    task: asyncio.Task | None = None
    missing: bool = False  # the backend's last answer was its 404 (not a failure to answer)


class Router:
    def __init__(self, config: Config, backends: dict[str, Backend], listing_timeout: float = 3.0,
                 info_ttl_s: float = 30.0, refresh_s: float = 60.0, unknown_ttl_s: float = 2.0,
                 start_listing_s: float = START_S, presets: PresetStore | None = None):
        self.config = config
        self.backends = backends
        self.presets = presets or PresetStore(config.presets.file())  # unopened: none until Generation opens it
        self.listing_timeout = listing_timeout
        self.info_ttl_s = info_ttl_s
        self.listings = Listings(backends, listing_timeout, refresh_s, unknown_ttl_s, start_listing_s)
        # (backend, model) -> what the backend said, and when; least recently asked first
        self._info: OrderedDict[tuple[str, str], _Info] = OrderedDict()
        self._asking: set[asyncio.Task] = set()  # the /api/show calls under way, an evicted entry's among them

    async def start(self) -> None:
        await self.listings.start()

    async def close(self) -> None:
        await self.listings.close()
        pending = list(self._asking)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def model_info(self, target: Target) -> ModelInfo | None:
        """What the backend says about the model (context, capabilities), kept `info_ttl_s` and refreshed behind
        the requests' backs once known: stages ask per request, and Ollama answers /api/show over HTTP. Only the
        first ask for a model waits (at most `listing_timeout`, shared by concurrent requests), and only requests
        for that backend. None when it cannot say (a model it serves without listing it, or a backend that is down):
        the request itself then finds out."""
        key = (target.backend.name, target.model)
        entry = self._info.get(key)
        if entry is not None:
            self._info.move_to_end(key)
        if entry is None:
            entry = self._info[key] = _Info(0.0, None)
            if len(self._info) > _INFO_ENTRIES:
                self._info.popitem(last=False)
            entry.task = self._ask(target, entry)
            await asyncio.wait([asyncio.shield(entry.task)], timeout=self.listing_timeout)
        elif time.monotonic() - entry.at > self.info_ttl_s and (entry.task is None or entry.task.done()):
            entry.task = self._ask(target, entry)
        elif entry.at == 0.0 and entry.task is not None:
            await asyncio.wait([asyncio.shield(entry.task)], timeout=self.listing_timeout)
        return entry.info

    async def model_info_now(self, target: Target) -> ModelInfo | None:
        """Asked again now and kept, for what a backend says differently once it runs (a managed llama-server's
        window): the requests after it read the new answer from here rather than ask the backend again."""
        entry = self._info.get((target.backend.name, target.model))
        if entry is None:
            return await self.model_info(target)
        entry.task = self._ask(target, entry)
        await asyncio.wait([asyncio.shield(entry.task)], timeout=self.listing_timeout)
        return entry.info

    def _ask(self, target: Target, entry: _Info) -> asyncio.Task:
        task = asyncio.create_task(self._show(target, entry))
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)
        return task

    async def _show(self, target: Target, entry: _Info) -> None:
        """A backend that cannot answer for a while keeps what it said last (the window and capabilities the fit
        and resolve stages check were dropped with each failed refresh); one that no longer has the model drops it."""
        try:
            entry.info, entry.missing = await asyncio.wait_for(target.backend.show(target.model),
                                                               self.listing_timeout), False
        except ModelNotFound:
            entry.info, entry.missing = None, True
        except Exception as e:  # noqa: BLE001 - any failure here means "unknown", never a failed request
            entry.missing = False
            log.debug("no model info for %s on %r: %s", target.model, target.backend.name, e)
        entry.at = time.monotonic()

    async def served_info(self, target: Target) -> ModelInfo | None:
        """`model_info` for a request answered without the backend generating (a count, a background response's
        creation): the 404 its generation would get, where the backend's own lookup says so before it is asked for an
        answer (`Backend.shows_every_model`: Ollama, the engine). Elsewhere, and while the backend does not answer,
        what `model_info` says, and the request itself finds out: an OpenAI-compatible server may serve names it
        neither lists nor shows, and a single-model llama-server answers any name with its one."""
        info = await self.model_info(target)
        entry = self._info.get((target.backend.name, target.model))
        if info is not None or entry is None or not entry.missing or not target.backend.shows_every_model:
            return info
        if time.monotonic() - entry.at > self.listings.fresh_s:  # a model pulled since, as `_resolve` looks again
            info = await self.model_info_now(target)
        if entry.missing and entry.task is not None and entry.task.done():  # not a 404 of before, asked again
            raise ModelNotFound(target.model)
        return info

    async def resolve(self, model: str) -> Target:
        if not model or len(model) > MAX_MODEL_NAME:  # no server names one so long: kept, it pinned its size
            raise ModelNotFound(model[:MAX_MODEL_NAME])
        if (preset := self.presets.get(model)) is not None:
            model = preset.base
        alias = by_spelling(self.config.aliases, model)
        if alias is None:
            return await self._resolve(model)
        backend, sep, name = alias.partition(":")
        if sep and backend in self.backends:
            return Target(self.backends[backend], name, model)
        return replace(await self._resolve(alias), label=model)

    async def _resolve(self, model: str) -> Target:
        target = self._routed(model)
        if target is None and self._from_listing(model) is None:
            await self.listings.refresh(unless_fresh=True)  # a model pulled since the last listing
        return target or self._from_listing(model) or self._default(model)

    def _routed(self, model: str) -> Target | None:
        for exact in (True, False):
            for route in self.config.routes:
                hit = route.match == model if exact else fnmatch.fnmatchcase(model, route.match)
                if hit:
                    return Target(self.backends[route.backend], route.model or model, route.match)
        return None

    def _from_listing(self, model: str) -> Target | None:
        for name in spellings(self.listings.known_as.get(model, model)):
            if (backend := self.listings.owner.get(name)) is not None:
                return Target(self.backends[backend], name, model)  # at most two spellings of a listed name
        # as Ollama finds a model: `Qwen3` and `registry.ollama.ai/library/qwen3` were a 404 where Ollama answers
        return next((Target(self.backends[backend], name, model) for name, backend in self.listings.owner.items()
                     if same_model(name, model)), None)

    def _default(self, model: str) -> Target:
        """The configured default backend; else the only one, unless it listed its models without this name and
        would answer it with another (HA, LobeChat and Page Assist kept a name from an Ollama setup, and got
        another model's answers under it where Ollama says 404; LobeChat offers its pull screen on that 404)."""
        if self.config.default_backend:
            return Target(self.backends[self.config.default_backend], model)
        if len(self.backends) != 1:
            raise self._not_found(model)
        [(name, only)] = self.backends.items()
        if only.answers_unlisted_names and self.listings.by_backend[name].models:
            raise ModelNotFound(model)
        return Target(only, model)

    def _not_found(self, model: str) -> VeloError:
        """404, unless a backend that has never listed its models (down since Velo started) may hold it: a 503
        then, which says to ask again, where a 404 said the model does not exist."""
        unknown = [name for name, entry in self.listings.by_backend.items() if not entry.answered and not entry.models]
        if not unknown:
            return ModelNotFound(model)
        return BackendUnavailable(f"model '{model}' is not listed by any backend that answers; "
                                  f"{', '.join(map(repr, unknown))} did not list its models yet", retry_after=5)

    async def list_models(self) -> list[ModelInfo]:
        """The union of every backend's models (first backend wins a name; a backend that never answered contributes
        nothing), plus aliases and presets (described as their base model). Asks the backends again, waiting only
        for those that answer."""
        await self.listings.refresh()
        seen: dict[str, ModelInfo] = {}
        for backend, info in self.listings.models():
            if info.name not in seen:
                seen[info.name] = replace(info, backend=backend)
        for alias, target in self.config.aliases.items():
            backend, sep, name = target.partition(":")  # as `resolve` reads it: "smollm2:135m" is a model's name
            base = by_spelling(seen, name if sep and backend in self.backends else target)
            seen.setdefault(alias, self._own(base, alias) if base else ModelInfo(name=alias))
        folded: dict[str, list[str]] = {}  # presets match names whatever their case (proxy/presets.py)
        for name in seen:
            folded.setdefault(name.casefold(), []).append(name)
        for preset in self.presets.all():  # a preset is what its name serves (`resolve`), over a listed model too
            base = by_spelling(seen, preset.base) or ModelInfo(name=preset.base)
            own = replace(self._own(base, preset.name, preset.settings()), modified_at=preset.modified_at)
            for spelling in spellings(preset.name):
                for name in folded.get(spelling.casefold(), []):
                    seen.pop(name, None)
            seen[preset.name] = own
        return list(seen.values())

    def _own(self, base: ModelInfo, name: str, *settings: Any) -> ModelInfo:
        """`base` listed as `name`, with a digest of its own where it has settings of its own (a preset's, its
        [models] table's), as Ollama gives a created model its manifest's and only a copy shares one: llm-ollama
        keeps one name per digest, and ran the base model for a preset, without its system prompt or options."""
        own = [s for s in (*settings, by_spelling(self.config.models, name)) if s]
        if not own or not base.digest:
            return replace(base, name=name)
        mixed = hashlib.sha256(f"{base.digest}{own!r}".encode())
        return replace(base, name=name, digest=mixed.hexdigest())
