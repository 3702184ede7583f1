"""What Ollama lets browsers do, done the same way: CORS for local and configured origins, and no answer to a
page that reached us through a foreign host name.

Browser clients (extensions, web UIs served from localhost, VS Code webviews) send a CORS preflight before
every JSON POST; without an answer they cannot use Velo where they could use Ollama. And like Ollama, Velo
refuses what a foreign web page sends: any request whose `Origin` is not allowed gets 403 before it reaches a
handler (a form post needs no preflight, so answering it would let any site run prompts on this machine), and
while bound to loopback, any request whose `Host` is not a local name (DNS rebinding: evil.example resolving
to 127.0.0.1 makes its requests same-origin).

Allowed origins: http(s) on localhost, 127.0.0.1 and 0.0.0.0 on any port, app://, file://, tauri://,
vscode-webview:// and vscode-file:// (Ollama's list), plus `[server] origins` and `OLLAMA_ORIGINS`
(comma-separated), so a setup made for Ollama keeps working; `*` allows all. Patterns use `*` as a wildcard.
"""
from __future__ import annotations

import functools
import ipaddress
import os
import socket
from dataclasses import dataclass
from fnmatch import fnmatchcase

from aiohttp import web

from adapters.errors import Forbidden

from .dialects import dialect_of
from .errors import error_response
from .inflight import request_id

LOCAL_ORIGINS = tuple(f"{scheme}://{host}{port}" for host in ("localhost", "127.0.0.1", "0.0.0.0")
                      for port in ("", ":*") for scheme in ("http", "https")) + (
    "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")
ALLOW_METHODS = "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"
ALLOW_HEADERS = ",".join([
    "Authorization", "Content-Type", "User-Agent", "Accept", "X-Requested-With", "OpenAI-Beta",
    *(f"x-stainless-{h}" for h in ("arch", "async", "custom-poll-interval", "helper", "helper-method", "lang", "os",
                                   "package-version", "poll-helper", "retry-count", "runtime", "runtime-version",
                                   "timeout")),
    # what the OpenAI SDK adds for an app that sets its organization or project: its every request failed preflight
    "OpenAI-Organization", "OpenAI-Project",
    # what Anthropic's SDK adds in a browser: without them no web page could use /v1/messages (LobeChat); its tool
    # runner adds x-stainless-helper
    "anthropic-version", "anthropic-beta", "anthropic-dangerous-direct-browser-access",
    # Velo's own: cache bypass, keys, the client's name (fair queueing, an autocomplete's place)
    "Cache-Control", "Pragma", "X-Api-Key", "X-Velo-Cache", "X-Velo-Client"])
# `*` is every header, for a request without credentials; a request with them reads `*` as a name, so Velo's own
# headers are named too
EXPOSE_HEADERS = ",".join(["*", "Retry-After", "x-request-id", *(f"X-Velo-{h}" for h in (
    "Cache", "Cache-Reason", "Repair", "Request-Id", "Tools", "Tools-Ignored", "Context-Trimmed", "Token-Count",
    "Best-Of"))])
MAX_AGE = str(12 * 3600)
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
_ORIGIN = "velo.cors_origin"  # request key: the allowed Origin whose answer carries CORS headers


@dataclass(frozen=True)
class OriginPolicy:
    origins: tuple[str, ...]
    check_host: bool  # only while bound to loopback: elsewhere the user chose to be reachable by any name
    machine_name: str = ""

    @classmethod
    def for_server(cls, bind_host: str, extra: list[str]) -> "OriginPolicy":
        from_env = [o.strip() for o in os.environ.get("OLLAMA_ORIGINS", "").split(",") if o.strip()]
        return cls(tuple(extra) + tuple(from_env) + LOCAL_ORIGINS, is_loopback(bind_host),
                   socket.gethostname().lower())

    def origin_allowed(self, origin: str) -> bool:
        return any(fnmatchcase(origin, pattern) for pattern in self.origins)

    @functools.lru_cache(maxsize=64)  # the same few Host headers on every request: parsing was 1.4% of one's time
    def host_allowed(self, host: str) -> bool:
        """Ollama's rule: IP addresses that are loopback, private or unspecified, `localhost`, this machine's
        name, and names under .localhost, .local and .internal."""
        name = _hostname(host).lower()
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return name in ("", "localhost", self.machine_name) or name.endswith(_LOCAL_SUFFIXES)
        return ip.is_loopback or ip.is_private or ip.is_unspecified


def guard(policy: OriginPolicy):
    """The middleware (outermost) and the response-prepare hook that adds CORS headers to every answer to an
    allowed origin, streams included."""

    @web.middleware
    async def browser_guard(request: web.Request, handler) -> web.StreamResponse:
        host = request.headers.get("Host", "")
        if policy.check_host and not policy.host_allowed(host):
            return _refused(request, f"host {host!r} is not a local name; Velo answers only local names while bound "
                                     "to loopback")
        origin = request.headers.get("Origin")
        if not origin or origin in (f"http://{host}", f"https://{host}"):
            return await handler(request)  # not a cross-origin request
        if not policy.origin_allowed(origin):
            return _refused(request, f"origin {origin!r} is not allowed; add it to [server] origins or OLLAMA_ORIGINS")
        request[_ORIGIN] = origin
        if request.method == "OPTIONS":  # as gin's cors answers Ollama's: any OPTIONS, preflight or not
            return web.Response(status=204, headers={
                "Access-Control-Allow-Methods": ALLOW_METHODS, "Access-Control-Allow-Headers": ALLOW_HEADERS,
                "Access-Control-Max-Age": MAX_AGE})
        return await handler(request)

    async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.get(_ORIGIN)
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
            response.headers.add("Vary", "Origin")

    return browser_guard, add_cors_headers


def _refused(request: web.Request, message: str) -> web.Response:
    """403 in the client's dialect; Anthropic's names the request's id in its body, as its other errors do. The dialect
    is read here, for the few requests refused: read for every request, it was 0.6% of a short chat request's
    instructions in Velo (2,319 -> 2,306 thousand, callgrind)."""
    dialect = dialect_of(request.path, request.headers)
    rid = request_id(request) if dialect == "anthropic" else None
    return error_response(Forbidden(message), dialect, request_id=rid)


def _hostname(host: str) -> str:
    """The name in a Host header, without its port ("[::1]:8000" -> "::1")."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(bind_host: str) -> bool:
    try:
        return ipaddress.ip_address(bind_host).is_loopback
    except ValueError:
        return bind_host.lower() == "localhost"
