"""Typed keys for what the app carries (aiohttp's AppKey, never module globals)."""
from __future__ import annotations

from aiohttp import web

from adapters.base import Backend

from .config import Config
from .pipeline import Pipeline
from .responses_store import ResponseStore
from .router import Router

CONFIG = web.AppKey("config", Config)
BACKENDS = web.AppKey("backends", dict[str, Backend])
ROUTER = web.AppKey("router", Router)
PIPELINE = web.AppKey("pipeline", Pipeline)
RESPONSES = web.AppKey("responses", ResponseStore)
