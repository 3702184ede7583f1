"""Typed keys for what the app and each request carry (aiohttp's AppKey and RequestKey, never module globals).

The configuration in force is a `Generation` (proxy/generation.py); each request is pinned to the one current
when it arrived, and reads its pipeline and router from the request, so a reload never changes them mid-request.
"""
from __future__ import annotations

from aiohttp import web

from .background import BackgroundRuns
from .dialects.documents import Documents
from .generation import Generation, Generations
from .live_responses import LiveResponses
from .pipeline import Pipeline
from .reload import Reloader
from .responses_store import ResponseStore
from .router import Router

GENERATIONS = web.AppKey("generations", Generations)
RELOADER = web.AppKey("reloader", Reloader)
RESPONSES = web.AppKey("responses", ResponseStore)
BACKGROUND = web.AppKey("background", BackgroundRuns)
DOCUMENTS = web.AppKey("documents", Documents)
LIVE = web.AppKey("live", LiveResponses)
GENERATION = web.RequestKey("generation", Generation)
PIPELINE = web.RequestKey("pipeline", Pipeline)
ROUTER = web.RequestKey("router", Router)
