"""What `velo chat` and `velo bench` say to a running Velo (or any Ollama- or OpenAI-compatible server).

`velo bench` chats through the OpenAI dialect as a stream (`/v1/chat/completions`, SSE) with
`stream_options.include_usage`, so token counts are the ones the server reports, not guessed. `velo chat` goes
through Ollama's `/api/chat` where the server speaks it (Velo, Ollama), as `ollama run` does, and so gets Ollama's
defaults (temperature 0.8, repeat penalty 1.1): with OpenAI's (temperature 1, no penalty) the shipped SmolLM2 ran
on to the 4,096-token cap, 3 to 4 minutes on two cores, where Ollama's ended in 10 to 27 tokens. Models are listed
from Ollama's `/api/tags` (Velo, Ollama), else `/v1/models` (llama-server, vLLM, LM Studio). Every failure a
user can cause becomes a `CommandError` with one line that names the URL.
"""
from __future__ import annotations

import argparse
import os
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator

import aiohttp
import orjson
from yarl import URL

from adapters.http import is_server_url

from . import CommandError

DEFAULT_URL = "http://127.0.0.1:8000"


class HttpError(CommandError):
    """The server answered with an error status; `status` lets callers try another route on a 404."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def add_connection_args(parser: Any) -> None:
    parser.add_argument("--url", default=DEFAULT_URL, type=_server_url,
                        help=f"Velo or any Ollama/OpenAI server (default {DEFAULT_URL})")
    parser.add_argument("--api-key", default=os.environ.get("VELO_API_KEY"),
                        help="sent as a bearer token (default: $VELO_API_KEY)")


def _server_url(text: str) -> str:
    """"notaurl" was sent as is, and failed as "GET notaurl/api/tags failed"."""
    if not is_server_url(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL (e.g. {DEFAULT_URL})")
    return text.rstrip("/")


# No total timeout: a bench stream or a long answer may take minutes. A server that says nothing for this long has
# stopped (Velo's streams send a heartbeat every 15 s; Ollama is silent while it loads a model, a minute or two for
# a large one from a slow disk): chat and bench waited forever on one that accepted and never answered.
SILENCE_S = 300.0


def open_session(api_key: str | None, connect_timeout: float = 5.0) -> aiohttp.ClientSession:
    """The session chat and bench talk through; retries (`_response`) know which connections were pooled ones."""
    headers = {"Authorization": f"Bearer {_key(api_key)}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=SILENCE_S)
    tracing = aiohttp.TraceConfig()
    tracing.on_connection_reuseconn.append(_reused)
    return aiohttp.ClientSession(headers=headers, timeout=timeout, connector=aiohttp.TCPConnector(limit=0),
                                 trace_configs=[tracing])


def _key(api_key: str) -> str:
    """The key without the line end a file read with `$(cat key.txt)` keeps on Windows' CRLF; a control character
    inside it can go in no header (aiohttp's ValueError was a traceback)."""
    key = api_key.strip()
    if not key.isprintable():
        raise CommandError("the API key holds a control character: check --api-key or $VELO_API_KEY")
    return key


async def _reused(session: aiohttp.ClientSession, context: Any, params: Any) -> None:
    if isinstance(context.trace_request_ctx, dict):
        context.trace_request_ctx["reused"] = True


def error_text(raw: bytes) -> str:
    """The message inside an Ollama (`{"error": "..."}`) or OpenAI (`{"error": {"message": ...}}`) error body."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace").strip()[:200] or "(empty body)"
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        err = err.get("message")
    return str(err or body)[:200]


@asynccontextmanager
async def _response(session: aiohttp.ClientSession, method: str, url: str,
                    **kwargs: Any) -> AsyncIterator[aiohttp.ClientResponse]:
    """The response, on a new connection when the pooled one turns out closed. llama-server closes the
    connection after each streamed answer without saying so: every other request on a reused one failed
    ('Server disconnected', 'Can not write request body'), and a retry from the same pool could take another
    such connection when several streams start at once. Only a pooled connection's failure is sent again: the
    server closed it before reading the request. On a new one the server may have read it (a backend that
    crashed on it), and a generation was sent twice. Keep-alive stays for the servers that keep it: a Velo cache
    hit took 0.9 ms on a kept connection, 1.3 ms with a new one each time."""
    async with AsyncExitStack() as stack:
        asked: dict[str, bool] = {}
        try:
            resp = await session.request(method, url, trace_request_ctx=asked, **kwargs)
        except aiohttp.ClientConnectorError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if not asked.get("reused"):
                raise
            fresh = await stack.enter_async_context(aiohttp.ClientSession(headers=session.headers,
                                                                          timeout=session.timeout))
            resp = await fresh.request(method, url, **kwargs)
        async with resp:
            yield resp


@asynccontextmanager
async def request(session: aiohttp.ClientSession, method: str, url: str,
                  **kwargs: Any) -> AsyncIterator[aiohttp.ClientResponse]:
    """`session.request` with failures as one-line `CommandError`s, including a stream that breaks mid-way."""
    try:
        async with _response(session, method, url, **kwargs) as resp:
            if resp.status >= 400:
                hint = " (--api-key or $VELO_API_KEY sends one)" if resp.status == 401 else ""
                raise HttpError(f"{method} {url} answered {resp.status}: {error_text(await resp.read())}{hint}",
                                resp.status)
            yield resp
    except aiohttp.ClientConnectorError as e:
        reason = "connection refused" if isinstance(e.os_error, ConnectionRefusedError) else str(e.os_error or e)
        raise CommandError(f"cannot reach {URL(url).origin()} ({reason}): is `velo serve` running there? "
                           "(--url picks another address)") from None
    except aiohttp.ClientError as e:  # timeouts included: aiohttp's are ClientErrors too
        raise CommandError(f"{method} {url} failed: {e or type(e).__name__}") from None


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with request(session, "GET", url) as resp:
        try:
            return orjson.loads(await resp.read())
        except orjson.JSONDecodeError:
            raise CommandError(f"GET {url} did not answer JSON: is it a model server?") from None


def listed_names(body: Any, key: str, name: str) -> list[str]:
    """`body[key][i][name]` for Ollama's /api/tags (models, name) and OpenAI's /v1/models (data, id); any other
    shape lists nothing (a server that is not what it seemed)."""
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list):
        return []
    return [m[name] for m in items if isinstance(m, dict) and isinstance(m.get(name), str)]


async def list_models(session: aiohttp.ClientSession, base: str) -> list[str]:
    """Names from /api/tags (Velo, Ollama), else /v1/models (OpenAI-compatible servers)."""
    try:
        return listed_names(await get_json(session, f"{base}/api/tags"), "models", "name")
    except HttpError as e:
        if e.status != 404:
            raise
    return listed_names(await get_json(session, f"{base}/v1/models"), "data", "id")


async def check_model(session: aiohttp.ClientSession, base: str, model: str | None) -> str:
    """The model to use: `model` if the server knows it (listed, or `/api/show` finds it: aliases, routes),
    else the first one listed when `model` is None."""
    names = await list_models(session, base)
    if model is None:
        if not names:
            raise CommandError(f"{base} lists no models: pull or configure one first")
        return names[0]
    if model in names:
        return model
    try:
        async with request(session, "POST", f"{base}/api/show", json={"model": model}):
            return model
    except HttpError:
        listed = ", ".join(names[:10]) + (" …" if len(names) > 10 else "")
        raise CommandError(f"model {model!r} is not served by {base} (it lists: {listed or 'nothing'})") from None


async def speaks_ollama(session: aiohttp.ClientSession, base: str) -> bool:
    """Whether the server answers Ollama's API (Velo and Ollama do; OpenAI-compatible servers answer 404)."""
    try:
        await get_json(session, f"{base}/api/version")
    except HttpError as e:
        if e.status != 404:
            raise
        return False
    return True


@dataclass
class Reply:
    """One streamed chat completion: iterate `texts()`; afterwards `usage` holds what the server counted."""

    response: aiohttp.ClientResponse
    usage: dict[str, int] | None = None

    @property
    def cache(self) -> str:
        """Velo's `X-Velo-Cache` verdict (exact, semantic, miss, bypass, off); empty from other servers."""
        return self.response.headers.get("X-Velo-Cache", "")

    async def texts(self) -> AsyncIterator[str]:
        async for event in _sse_events(self.response.content):
            if "error" in event:
                raise CommandError(f"the stream from {self.response.url} failed: {error_text(orjson.dumps(event))}")
            self.usage = event.get("usage") or self.usage
            for choice in event.get("choices") or []:
                if text := (choice.get("delta") or {}).get("content"):
                    yield text


async def _sse_events(content: aiohttp.StreamReader) -> AsyncIterator[dict[str, Any]]:
    async for line in content:
        if not line.startswith(b"data:"):
            continue  # blank separators, `event:` and `:` comment lines
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield _json_object(data, "event")


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    """One streamed event's JSON object; anything else is a one-line error naming the malformed `what`."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        event = None
    if not isinstance(event, dict):
        raise CommandError(f"a malformed stream {what}: {data[:100]!r}")
    return event


@dataclass
class OllamaReply:
    """One streamed `/api/chat` answer: iterate `texts()`."""

    response: aiohttp.ClientResponse

    async def texts(self) -> AsyncIterator[str]:
        async for line in self.response.content:
            if not line.strip():
                continue
            event = _json_object(line, "line")
            if "error" in event:
                raise CommandError(f"the stream from {self.response.url} failed: {error_text(line)}")
            if text := (event.get("message") or {}).get("content"):
                yield text


@asynccontextmanager
async def ollama_chat_stream(session: aiohttp.ClientSession, base: str, model: str,
                             messages: list[dict[str, Any]]) -> AsyncIterator[OllamaReply]:
    """POST /api/chat, streamed (Ollama's default), with no options: the server's defaults, as `ollama run` sends."""
    async with request(session, "POST", f"{base}/api/chat", json={"model": model, "messages": messages}) as resp:
        yield OllamaReply(resp)


@asynccontextmanager
async def chat_stream(session: aiohttp.ClientSession, base: str, model: str, messages: list[dict[str, Any]],
                      headers: dict[str, str] | None = None, **options: Any) -> AsyncIterator[Reply]:
    """POST /v1/chat/completions with stream=true; `options` are OpenAI fields (max_tokens, temperature)."""
    body = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            **options}
    async with request(session, "POST", f"{base}/v1/chat/completions", json=body, headers=headers) as resp:
        yield Reply(resp)
