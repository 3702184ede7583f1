"""Who is asking: the API key check (when keys are configured) and the caller's cache scope."""
from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
from typing import Awaitable, Callable

from aiohttp import web

from adapters.errors import Forbidden, Unauthorized

from .config import ServerConfig
from .job import Caller

CALLER = "velo.caller"  # request key: the Caller of every /api and /v1 request
OPEN_PATHS = frozenset({"/", "/health", "/ready", "/metrics"})
# What shows or ends other keys' requests (the dashboard, requests in flight, llama-server's slots: their tasks, and
# saving, restoring or erasing their caches) or changes what every key gets (presets shadow models: Ollama's
# create/copy/delete, pulls, pushes, blobs)
ADMIN_PATHS = ("/ui", "/velo/", "/slots", "/api/create", "/api/copy", "/api/delete", "/api/pull", "/api/push",
               "/api/blobs/")
ANONYMOUS = "anonymous"  # the scope of requests without a key
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api_key(request: web.Request, keys: tuple[str, ...] = ()) -> str | None:
    """`Authorization: Bearer KEY` (OpenAI, Ollama clients), else `x-api-key` (Anthropic clients), else HTTP Basic
    with the key as the password (a browser's own login box, for the dashboard). Where both headers come and only
    `x-api-key` holds one of `keys`, that one: Claude Code sends its ANTHROPIC_AUTH_TOKEN as a Bearer beside its
    ANTHROPIC_API_KEY, and the Bearer left over from another service was a 401 for the key Velo knows."""
    presented = _authorization(request.headers.get("Authorization", ""))
    other = request.headers.get("X-Api-Key") or None
    if presented is None or (other is not None and not is_one_of(presented, keys) and is_one_of(other, keys)):
        return other
    return presented


def _authorization(auth: str) -> str | None:
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    if auth.lower().startswith("basic "):
        try:
            return base64.b64decode(auth[6:].strip(), validate=True).decode().partition(":")[2] or None
        except (binascii.Error, UnicodeDecodeError):
            return None
    return None


def caller_for(request: web.Request, server: ServerConfig) -> Caller:
    """Authenticates (when keys are configured) and scopes the request to its key; the dashboard and the requests
    in flight, where `admin_keys` are set, only for those.

    Without configured keys, a client that still sends a key gets its own scope; one that sends none shares the
    anonymous scope, as a single-user local setup expects.
    """
    key = api_key(request, tuple(server.keys))
    if server.keys and not is_one_of(key, tuple(server.keys)):
        raise Unauthorized("invalid or missing API key")
    if server.admin_keys and not is_one_of(key, tuple(server.admin_keys)) and request.path.startswith(ADMIN_PATHS):
        raise Forbidden(f"{request.path} is for the keys in [server] admin_keys")
    tenant = tenant_of(key)
    # the key's label, never the key or its hash: the client is listed to an admin (GET /velo/requests) and
    # logged; a name the client gives itself comes after it, where it could pass for another key ("key:key2") and
    # share that key's place in a backend's queue
    named = request.headers.get("X-Velo-Client")
    if named:  # its bytes that are not UTF-8 as U+FFFD: as lone surrogates, the requests in flight could not be listed
        named = _as_sent(named).decode("utf-8", "replace")
    if key:
        who = key_labels(tuple(server.keys)).get(tenant, tenant)  # a key nobody configured is no secret of the config
        client = f"key:{who}/{named}" if named else f"key:{who}"
    else:
        client = named or request.remote or ""
    return Caller(tenant=tenant, client=client, path=request.path)


def viewer(caller: Caller, server: ServerConfig) -> str | None:
    """The tenant whose requests the caller sees (in flight, on the dashboard) and cancels: its own where keys are
    set and no admin_keys (any key gets there); None, every request, for an admin where admin_keys are set (no
    other key gets there) and for the single local user of a Velo without keys, whose tools may each send a key
    of their own (the openai SDK must send one) that is no identity."""
    return caller.tenant if server.keys and not server.admin_keys else None


def is_one_of(key: str | None, keys: tuple[str, ...]) -> bool:
    """Whether `key` is one of `keys`, in a time that does not tell a guess how much of a key it got right: a string
    compare stops at the first byte that differs. Each key is compared as its SHA-256, all of them, in constant time."""
    if key is None:
        return False
    guess = hashlib.sha256(_as_sent(key)).digest()
    return sum(hmac.compare_digest(guess, digest) for digest in _digests(keys)) > 0


@functools.lru_cache(maxsize=8)
def _digests(keys: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(_as_sent(key)).digest() for key in keys)


@functools.lru_cache(maxsize=8)
def key_labels(keys: tuple[str, ...]) -> dict[str, str]:
    """Each configured key's scope -> its label where others see it (/metrics, which needs no key; the log; the
    requests in flight): its place in the config, `key1`, `key2`, ... (api_keys, then admin_keys). Anything
    computed from the key alone (its bare hash, or an HMAC keyed by the keys) let a weak key be guessed offline."""
    labels = {ANONYMOUS: ANONYMOUS}
    for key in keys:
        labels.setdefault(tenant_of(key), f"key{len(labels)}")
    return labels


def tenant_of(key: str | None) -> str:
    """A key's scope: its hash (the key itself is never kept), or the anonymous scope."""
    return hashlib.sha256(_as_sent(key)).hexdigest()[:16] if key else ANONYMOUS


def authenticate(server: Callable[[web.Request], ServerConfig]) -> Callable:
    """`server(request)`: the settings in force for that request (their keys change with a config reload)."""
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS:
            try:
                request[CALLER] = caller_for(request, server(request))
            except (Unauthorized, Forbidden) as e:
                if request.path == "/ui" or request.path.startswith("/ui/"):  # the browser asks for (another) key
                    which = "an admin" if isinstance(e, Forbidden) else "an"
                    return web.Response(status=401, text=f"{which} API key is needed (as the password; any user name)",
                                        headers={"WWW-Authenticate": 'Basic realm="Velo", charset="UTF-8"'})
                raise
        return await handler(request)
    return middleware


def _as_sent(key: str) -> bytes:
    """The key's bytes as the client sent them: aiohttp reads a header's bytes that are not UTF-8 as lone surrogates
    (surrogateescape), which a plain encode() refused with a 500."""
    return key.encode("utf-8", "surrogateescape")
