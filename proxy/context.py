"""Per-request facts the layers below the handler need and report back (tenant, cache outcome, repairs)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from aiohttp import web

from adapters.errors import Unauthorized

CONTEXT = "velo.context"  # request key: the RequestContext built by the middleware


@dataclass
class RequestContext:
    tenant: str = "anonymous"  # cache scope: no request ever sees another tenant's cached answer
    client: str = ""  # who is asking, for fairness and autocomplete supersession
    route: str = ""
    priority: int = 1  # 0 = latency-critical (autocomplete / fill-in-the-middle)
    cache_bypass: bool = False
    cache_status: str = "miss"  # "exact" | "semantic" | "miss" | "bypass" | "off"
    repairs: list[str] = field(default_factory=list)


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("X-Api-Key") or None


def context_for(request: web.Request, api_keys: list[str]) -> RequestContext:
    """Authenticates (when keys are configured) and scopes the request to its key.

    Without configured keys, a client that still sends a key gets its own scope; one that sends none shares the
    anonymous scope, as a single-user local setup expects.
    """
    key = _bearer(request)
    if api_keys and key not in api_keys:
        raise Unauthorized("invalid or missing API key")
    tenant = hashlib.sha256(key.encode()).hexdigest()[:16] if key else "anonymous"
    client = request.headers.get("X-Velo-Client") or key or (request.remote or "")
    return RequestContext(tenant=tenant, client=client, route=request.path)
