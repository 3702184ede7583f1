"""Typed keys for what the app and each request carry (aiohttp's AppKey / request keys, never module globals)."""
from __future__ import annotations

from aiohttp import web

from adapters.base import Backend

from .config import Config
from .context import CONTEXT  # noqa: F401 - the request key lives with RequestContext
from .pipeline import Pipeline
from .router import Router

CONFIG = web.AppKey("config", Config)
BACKENDS = web.AppKey("backends", dict[str, Backend])
ROUTER = web.AppKey("router", Router)
PIPELINE = web.AppKey("pipeline", Pipeline)
