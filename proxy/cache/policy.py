"""What may be cached, and how a client asks Velo not to use the cache.

Bypass signals (any one is enough; a bypassed request is neither answered from nor written to the cache):
- header `Cache-Control: no-cache` or `no-store` (also `Pragma: no-cache`), the HTTP way;
- header `X-Velo-Cache: off` (also `bypass`, `no`, `false`, `0`), for clients that cannot set Cache-Control;
- body field `"cache": false` at the top level (OpenAI SDKs send it through `extra_body`) or inside Ollama's
  `"options": {"cache": false}` (the one free-form object Ollama clients let a user fill).
"""
from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from adapters.protocol import Chunk
from adapters.schema import setting

from .keys import Request

# "length" is whole too where the request's own max_tokens ended it: the same request ends the same way.
COMPLETE = frozenset({"stop", "length", "tool_calls"})
_OFF = frozenset({"off", "bypass", "no", "false", "0"})


def bypass_requested(headers: Mapping[str, str], body_extras: dict[str, Any]) -> bool:
    if not isinstance(headers, (CIMultiDict, CIMultiDictProxy)):  # plain dicts are case-sensitive; aiohttp's not
        headers = CIMultiDict(headers)
    control, pragma, velo = (headers.get(name, "").lower() for name in ("cache-control", "pragma", "x-velo-cache"))
    if {d.strip().split("=")[0] for d in control.split(",")} & {"no-cache", "no-store"} or "no-cache" in pragma:
        return True
    if velo.strip() in _OFF:
        return True
    options = body_extras.get("options")
    return body_extras.get("cache") is False or (isinstance(options, dict) and options.get("cache") is False)


def complete_stream(chunks: list[Chunk], max_tokens: int | None) -> bool:
    """Only a whole, successful answer is worth replaying: not an error, a cancel or a stream cut short, nor one
    the context window cut before the request's `max_tokens`."""
    return bool(chunks) and chunks[-1].finish_reason in COMPLETE and all(
        c.finish_reason in (None, *COMPLETE) for c in chunks) and not _cut_by_window(chunks[-1], max_tokens)


def _cut_by_window(last: Chunk, max_tokens: int | None) -> bool:
    """A "length" end short of `max_tokens` (or with none, or no count to tell): the window ran out, which is the
    server's (its -c, Ollama's loaded num_ctx), not the request's; replayed, a cut answer went on being served
    after the window grew and the backend would have answered whole."""
    if last.finish_reason != "length":
        return False
    return not max_tokens or last.usage is None or last.usage.completion_tokens < max_tokens


@dataclass
class RoutePolicy:
    """Cache settings per model name or glob (first match wins); a key left out keeps the [cache] value."""

    match: str = setting(doc="model name or glob, as the client sends it")
    enabled: bool | None = setting(None, "as [cache] enabled", default_doc="the [cache] value")
    semantic: bool | None = setting(None, "as [cache] semantic", default_doc="the [cache] value")
    cache_nondeterministic: bool | None = setting(None, "as [cache] cache_nondeterministic",
                                                  default_doc="the [cache] value")
    ttl_s: float | None = setting(None, "as [cache] ttl_s", min=0, default_doc="the [cache] value")


@dataclass
class Policy:
    """The settings that apply to one request once route overrides are folded in."""

    enabled: bool
    semantic: bool
    cache_nondeterministic: bool
    ttl_s: float

    def with_route(self, routes: list[RoutePolicy], route: str) -> "Policy":
        for r in routes:
            if fnmatch.fnmatchcase(route, r.match):
                return Policy(*(getattr(self, n) if getattr(r, n) is None else getattr(r, n)
                                for n in ("enabled", "semantic", "cache_nondeterministic", "ttl_s")))
        return self

    def why_not(self, req: Request) -> str:
        """Why `req` is never answered from the cache, or "" when it may be (X-Velo-Cache-Reason). Greedy or seeded
        requests only by default: a sampled answer replayed would hide the sampling."""
        if not self.enabled:
            return "the cache is off for this model"
        if not (self.cache_nondeterministic or req.options.deterministic):
            return "sampled: only requests with temperature 0 or a seed are cached"
        return ""
