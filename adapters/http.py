"""HTTP plumbing shared by the adapters of HTTP backends (Ollama, llama-server, OpenAI-compatible servers).

One pooled `aiohttp.ClientSession` per backend, the four timeouts of `BackendConfig` and the mapping of every
transport failure or upstream error status to Velo's domain errors, so adapters only speak their wire format.

Timeouts: `connect_timeout` bounds the TCP connect; `first_token_timeout` bounds the wait for the response head
and for a generation's first token, each gap of it: a backend that reports its progress through a long prompt
(llama-server's `return_progress`) keeps waiting as long as it reports; `idle_timeout` bounds each later gap
between bytes; `total_timeout` bounds the whole stream.
Generations are streamed from the backend, so a backend that hangs is found out after `first_token_timeout`,
not `total_timeout`; for a client that asked for one answer, `one_answer` folds the stream into one chunk before it
enters the pipeline, which then costs what a single answer did (per-token chunks through every stage halved the
proxy's max req/s). The stream costs the backend itself (a zero-work fake: 108 -> 208 us of CPU a request), so
`always_stream = false` sends one-answer requests as asked, their hang found only after `total_timeout`.

Every answer is parsed inside `shaped`: valid JSON of the wrong shape is the backend's fault, a 502 naming it,
never a 500 with a traceback.
"""
from __future__ import annotations

import asyncio
import re
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, AsyncIterator, Callable, TypeVar

import aiohttp
import orjson
from yarl import URL

from .base import BackendConfig
from .bursts import Burst
from .copies import replaced
from .errors import (Answered, BackendError, BackendTimeout, BackendUnavailable, BadRequest, ContextOverflow,
                     ModelLacks, ModelNotFound, Overloaded, PayloadTooLarge, Unsupported, VeloError)
from .exact_json import dumps, loads
from .protocol import ChatRequest, Chunk, CompletionRequest, aggregate

T = TypeVar("T")
R = TypeVar("R", ChatRequest, CompletionRequest)
# Pooled connections idle longer than this are not reused: below the 5 s after which llama-server and uvicorn
# (vLLM, SGLang) close idle keep-alive connections, so a request is never sent on one the server is closing.
KEEPALIVE_S = 4.0
_SHAPE_ERRORS = (KeyError, IndexError, TypeError, AttributeError, ValueError)
_ERROR_BODY_BYTES = 64 * 1024  # of an error answer read for its message: a backend's HTML page, never a whole file
_JSON = {"Content-Type": "application/json"}
# A stream asked uncompressed: a gzip on the way (nginx's `gzip on` for text/event-stream before a vLLM) holds
# its events until its buffer fills, and the answer comes whole at the end, or after first_token_timeout
_STREAMED = {**_JSON, "Accept-Encoding": "identity"}


def _as_is(obj: Any) -> Any:
    return obj


_SKIPPED = object()  # a line that carries no event (`Upstream._sse_payload`)


# llama-server answers every request 503 "Loading model" from the moment it listens until its model is loaded
# (tools/server/server-http.cpp): 2.5 s for Qwen2.5-Coder-1.5B from this machine's page cache, minutes for a large
# model from disk. Asking again every 0.25 s costs a loading server nothing (each 503 comes in ~1 ms).
_LOADING = "Loading model"
LOADING_POLL_S = 0.25


class Loading(BackendUnavailable):
    """The backend is loading its model: a request may wait for it (Upstream.request)."""


def _never(obj: Any) -> bool:
    return False


@dataclass
class _Start:
    """Whether a generation's stream has sent more than prompt progress (events `progress` recognises): until then
    each gap may take `first_token_timeout`, after it `idle_timeout`."""

    progress: Callable[[Any], bool]
    begun: bool = False

    def note(self, event: Any) -> None:
        """The first event that is more than prompt progress begins the answer."""
        if not self.begun and not self.progress(event):
            self.begun = True


def is_server_url(url: str) -> bool:
    """An http(s) URL with a host: "127.0.0.1:8080/v1" reads as a scheme and a path, and "notaurl" as a path."""
    parsed = URL(url)
    return parsed.scheme in ("http", "https") and bool(parsed.host)


def asked_of(req: R, config: BackendConfig) -> R:
    """`req` as a backend is asked it: a stream, whatever the client asked, unless `always_stream = false`; the
    adapter folds a one-answer request's stream (`one_answer`)."""
    return req if req.stream or not config.always_stream else replaced(req, stream=True)


async def one_answer(stream: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """The whole stream as one chunk (closing it early closes the stream, which cancels the backend's work)."""
    async with aclosing(stream):  # type: ignore[type-var]
        chunks = [c async for c in stream]
    yield aggregate(chunks)


def json_object(obj: Any) -> dict[str, Any]:
    """An answer that must be a JSON object (for `parse=`)."""
    if not isinstance(obj, dict):
        raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _never_sent(e: BaseException) -> bool:
    """aiohttp found the connection closed while writing the request (a pooled connection the server had just
    closed: llama-server closes some after a stream), so the backend never got a whole request."""
    return isinstance(e, aiohttp.ClientConnectionResetError) or isinstance(e.__cause__,
                                                                           aiohttp.ClientConnectionResetError)


def error_message(body: bytes) -> str:
    """The human message of an upstream error body: Ollama's `{"error": "..."}` or OpenAI's `{"error": {...}}`."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace").strip()[:500]
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)
    return str(err)


# vLLM's and SGLang's overflow 400s carry their counts only in words, which changed between versions:
#   vLLM    "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2000 in the
#           messages, 100 in the completion)." / "... your prompt contains at least 2049 input tokens" / "... your
#           request has 2100 input tokens" / "... for a total of at least 2100 tokens"
#   SGLang  "Requested token count exceeds the model's maximum context length of 2048 tokens. You requested a total
#           of 2100 tokens: ..." / "Input length (2100 tokens) exceeds the maximum allowed length (2048 tokens)."
#   OpenAI  "This model's maximum context length is 2048 tokens. However, your messages resulted in 2100 tokens." (an
#           upstream that words it as OpenAI does, Velo's own dialect included)
_WINDOW = re.compile(r"maximum (?:context length|allowed length)(?: is| of| \()\s*(\d+)")
_PROMPT = re.compile(r"\((\d+) in the messages|(\d+) input tokens|(\d+) tokens from the input|Input length \((\d+)"
                     r"|requested (\d+) tokens in the messages|resulted in (\d+) tokens")
_TOTAL = re.compile(r"total of (?:at least )?(\d+)|you requested (\d+) tokens")
# llama-server refuses media for a model loaded without its projector with a 500 ("image input is not supported -
# hint: ... mmproj"), which SDKs retry three times; it is the request's to fix: Ollama's 400 "does not support vision".
# /completion's 400 for its `multimodal_data` ("Multimodal data provided, but model does not support ..."), which
# Velo fills with images alone, is the same want.
_NO_MEDIA = re.compile(r"(image|audio|video|Multimodal) (?:input is not supported|data provided, but model does not)")
_MEDIA_FEATURE = {"image": "vision", "audio": "audio", "video": "video", "Multimodal": "vision"}
# llama-server answers a field of the wrong type or a missing one in the body it reads (nlohmann::json's exceptions:
# /tokenize's `content: null`, /infill without `input_suffix`) with a 500 too: the request's mistake, a 400 (on its
# own routes, whose clients' bodies are passed on as they are, in its own shape: llamacpp._unread_as_400)
BODY_UNREAD = "[json.exception."


def _overflow(body: bytes, path: str) -> ContextOverflow | None:
    """A backend's own overflow with its counts, which each dialect then words as its clients recognise
    (context_length_exceeded, "prompt is too long"), where a plain 400 made agents give up: llama-server's
    "exceed_context_size_error", vLLM's and SGLang's sentences. It names the prompt where `path` takes one (OpenAI's
    `param` of a completion's overflow), else the messages."""
    try:
        err = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    field = "prompt" if path in _PROMPT_PATHS else "messages"
    if isinstance(err, dict) and err.get("type") == "exceed_context_size_error":
        tokens, limit = err.get("n_prompt_tokens"), err.get("n_ctx")
        return ContextOverflow(tokens, limit, field) if isinstance(tokens, int) and isinstance(limit, int) else None
    message = error_message(body)
    window, prompt, total = (_number(p.search(message)) for p in (_WINDOW, _PROMPT, _TOTAL))
    if window is None or (asked := prompt if prompt is not None and prompt >= window else total or prompt) is None:
        return None
    return ContextOverflow(asked, window, field)  # the prompt where it alone overflows, else prompt and answer


_PROMPT_PATHS = ("/v1/completions", "/completion", "/infill")  # where a generation's request is a prompt


def _seconds_until(retry_after: str) -> float | None:
    """A Retry-After header in seconds: RFC 9110's delay-seconds, or its HTTP-date, which a gateway in front of a
    server may send (dropped, the client was told nothing); None for anything else."""
    if retry_after.isdigit():
        return float(retry_after)
    try:
        when = parsedate_to_datetime(retry_after)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, as every HTTP-date is
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _number(match: re.Match[str] | None) -> int | None:
    return None if match is None else int(next(g for g in match.groups() if g is not None))


# llama-server closes its connection after each stream, though its head says keep-alive: a pooled one was taken for
# the next request as it closed ("closed the connection ... before answering", a 502 under load). It names itself in
# every answer, so whatever kind of backend points at it stops pooling at its first answer.
_CLOSES_AFTER_STREAMS = "llama.cpp"


@dataclass
class Upstream:
    """The HTTP side of one backend: its session, its base URL and its timeout policy."""

    config: BackendConfig
    pooled: bool = True  # keep connections alive between requests (False: a new connection for each)
    waits_for_loads: bool = True  # a replica does not: another one may be ready (adapters/replicas.py)
    _session: aiohttp.ClientSession | None = None
    _fresh: aiohttp.ClientSession | None = None  # never reuses a connection: for the one retry

    @property
    def url(self) -> str:
        if not self.config.urls:
            raise BackendUnavailable(f"backend {self.config.name!r} has no url configured")
        return self.config.urls[0].rstrip("/")

    @property
    def shown_url(self) -> str:
        """The base URL as messages name it, without the user and password it may carry (basic auth in front of a
        server): messages reach clients and logs."""
        return str(URL(self.url).with_user(None))

    def scrubbed(self, text: str) -> str:
        """`text` without the backend's secrets (its key, its URL's password), wherever a message quotes them."""
        for secret in (self.config.api_key, URL(self.url).password):
            if secret:
                text = text.replace(secret, "***")
        return text

    def session(self) -> aiohttp.ClientSession:
        if not self.pooled:
            return self.fresh_session()
        if self._session is None or self._session.closed:
            self._session = self._new_session(aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S))
        return self._session

    def fresh_session(self) -> aiohttp.ClientSession:
        if self._fresh is None or self._fresh.closed:
            self._fresh = self._new_session(aiohttp.TCPConnector(limit=0, force_close=True))
        return self._fresh

    def _new_session(self, connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
        cfg = self.config
        return aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None,
            timeout=aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout, sock_connect=cfg.connect_timeout),
            # no cookie jar: the session is every client's, so a cookie a backend (or a gateway before it) set
            # for one request went out with everyone's next (aiohttp keeps those of any host named, not an IP)
            cookie_jar=aiohttp.DummyCookieJar(), connector=connector)

    async def close(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None

    @asynccontextmanager
    async def request(self, method: str, path: str, body: Any = None, *, wait: float, model: str | None = None,
                      as_is: tuple[int, ...] = (), raw: aiohttp.StreamReader | None = None,
                      ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send a request and hand over the response once its head arrived within `wait` seconds. A POST (a
        generation, embeddings) that finds the backend loading its model is sent again every `LOADING_POLL_S`
        for up to `first_token_timeout`, as Ollama makes a request wait for its model's load. An error with a
        status in `as_is` is raised as the backend's own answer (`Answered`). `raw`: a body that is not JSON, sent
        as it arrives (a client's upload) and so only once, on a connection of its own.

        Leaving the block early (the client went away) closes the connection, which cancels the upstream's work.
        """
        loop = asyncio.get_running_loop()
        until = loop.time() + self.config.first_token_timeout
        resp = await self._head(method, path, body, wait, raw)
        try:
            while resp.status >= 300:
                if resp.status in as_is:
                    answer = await self._error_body(resp)
                    raise Answered(resp.status, answer, self.scrubbed(error_message(answer) or resp.reason or ""))
                try:
                    await self._raise_for_status(resp, path, model)
                except Loading:
                    if not self.waits_for_loads or method != "POST" or raw is not None \
                            or loop.time() + LOADING_POLL_S > until:
                        raise
                resp.release()
                await asyncio.sleep(LOADING_POLL_S)
                resp = await self._head(method, path, body, wait)
            yield resp
        finally:
            if resp.content.at_eof():
                resp.release()
            else:
                resp.close()

    async def _head(self, method: str, path: str, body: Any, wait: float,
                    raw: aiohttp.StreamReader | None = None) -> aiohttp.ClientResponse:
        """The response, once its head arrived within `wait` seconds; each transport failure as its domain error."""
        name = self.config.name
        try:
            async with asyncio.timeout(wait):
                resp = await self._send(method, path, body, raw)
            if resp.headers.get("Server") == _CLOSES_AFTER_STREAMS:
                self.pooled = False
            return resp
        except aiohttp.ServerTimeoutError as e:
            raise BackendTimeout(f"backend {name!r} at {self.shown_url} did not accept a connection within "
                                 f"{self.config.connect_timeout:g}s") from e
        except asyncio.TimeoutError as e:
            raise BackendTimeout(f"backend {name!r} did not answer {path} within {wait:g}s") from e
        except aiohttp.ClientConnectorError as e:
            raise BackendUnavailable(f"backend {name!r} at {self.shown_url} is not reachable ({e.os_error})") from e
        except aiohttp.ServerDisconnectedError as e:
            raise BackendError(f"backend {name!r} closed the connection on {path} before answering (not sent "
                               "again: it may have taken the request)").taken_by_backend() from e
        except aiohttp.ClientError as e:
            raise BackendError(f"backend {name!r} failed on {path}: {self._described(e)}").taken_by_backend() from e

    async def _send(self, method: str, path: str, body: Any,
                    raw: aiohttp.StreamReader | None = None) -> aiohttp.ClientResponse:
        """Sent again once, on a new connection, only when it never went out: a pooled connection found closed
        while writing it. Never once the backend may have taken it (it read the request, then dropped the
        connection): it may have crashed on it, and sending it again would crash it again. A `raw` body, read as it
        is sent, cannot be sent again: it goes on a new connection from the start."""
        if raw is not None:
            return await self.fresh_session().request(method, self.url + path, data=raw, allow_redirects=False)
        data = None if body is None else dumps(body)  # bytes as they go out: `json=` made str, then bytes
        headers = None if body is None else _STREAMED if isinstance(body, dict) and body.get("stream") else _JSON
        try:
            return await self.session().request(method, self.url + path, data=data, headers=headers,
                                                allow_redirects=False)
        except aiohttp.ClientConnectorError:
            raise
        except aiohttp.ClientOSError as e:
            if not _never_sent(e):
                raise
            return await self.fresh_session().request(method, self.url + path, data=data, headers=headers,
                                                      allow_redirects=False)

    def _described(self, e: aiohttp.ClientError) -> str:
        """An aiohttp failure as a client may read it: its repr carries the request's headers, the backend's
        Authorization among them, which went out in 502s (and logs) on a malformed answer."""
        what = f"{e.status} {e.message}" if isinstance(e, aiohttp.ClientResponseError) else str(e)
        return self.scrubbed(f"{type(e).__name__}: {what}")

    async def _raise_for_status(self, resp: aiohttp.ClientResponse, path: str, model: str | None) -> None:
        where = f"backend {self.config.name!r}"
        if resp.status < 400:  # followed, a redirect made a POST a GET without its body: a 405, a misleading 404
            moved = self.scrubbed(resp.headers.get("Location", "?"))
            raise BackendError(f"{where} redirected {path} to {moved} ({resp.status}); Velo does not follow "
                               "redirects: set the backend's url to where the server is")
        body = await self._error_body(resp)
        message = self.scrubbed(error_message(body) or resp.reason or "")
        if resp.status == 404 and model:
            raise ModelNotFound(model)
        if (overflow := _overflow(body, path)) is not None:
            raise overflow
        if (media := _NO_MEDIA.match(message)) is not None:
            feature = _MEDIA_FEATURE[media.group(1)]
            raise ModelLacks(model, feature) if model else BadRequest(f"{where} cannot take {feature} input: {message}")
        if resp.status in (400, 422) or (resp.status == 500 and message.startswith(BODY_UNREAD)):
            raise BadRequest(f"{where} rejected the request: {message}")
        if resp.status == 413:  # the body Velo passed on was the client's, and too large for a proxy in front
            raise PayloadTooLarge(f"{where} refused the request as too large: {message}")
        # its Retry-After goes on to the client, for a 503 as for a 429: RFC 9110 gives it to both
        retry_after = _seconds_until(resp.headers.get("Retry-After", ""))
        if resp.status == 429:
            raise Overloaded(f"{where} is overloaded: {message}", retry_after=retry_after)
        if resp.status == 501:
            raise Unsupported(f"{where} cannot do {path}: {message}")
        if resp.status == 503 and message == _LOADING:
            raise Loading(f"{where} is still loading its model")
        if resp.status == 503:
            raise BackendUnavailable(f"{where} is unavailable: {message}", retry_after=retry_after)
        raise BackendError(f"{where} answered {resp.status} on {path}: {message}")

    async def _error_body(self, resp: aiohttp.ClientResponse) -> bytes:
        body = b""
        async with aclosing(self.reads(resp, self.config.idle_timeout, None)) as pieces:
            async for data in pieces:
                body += data
                if len(body) >= _ERROR_BODY_BYTES:  # its message is in its start: an HTML page is not read whole
                    break
        return body

    async def reads(self, resp: aiohttp.ClientResponse, first_wait: float, total: float | None,
                     started: _Start | None = None) -> AsyncIterator[bytes]:
        """The raw body in pieces: the first within `first_wait`, later ones within `idle_timeout` each, or within
        `first_wait` each while `started` says only progress came. What has arrived already is taken whole and at
        once; only an empty buffer arms a timer (a timer per read was 2.6% of the proxy's time at max req/s, in a
        py-spy profile)."""
        loop = asyncio.get_running_loop()
        deadline = None if total is None else loop.time() + total
        wait, what = first_wait, "sent no first data"
        content, burst = resp.content, Burst()
        while True:
            limit = wait if deadline is None else min(wait, deadline - loop.time())
            late = limit < wait  # the whole answer's time runs out first
            limit = max(limit, 0)
            try:
                data = content.read_nowait() if limit > 0 else b""
                if not data and not content.at_eof():
                    async with asyncio.timeout(limit):
                        data = await content.readany()
            except asyncio.TimeoutError as e:
                why = f"did not send the whole answer within {total:g}s" if late else f"{what} within {limit:g}s"
                raise BackendTimeout(f"backend {self.config.name!r} {why}") from e
            except aiohttp.ClientError as e:
                raise BackendError(f"backend {self.config.name!r} broke the stream: "
                                   f"{self._described(e)}").taken_by_backend() from e
            if not data:
                return
            yield data
            await burst.pause()  # what arrived together is read without waiting (adapters/bursts.py)
            if started is None or started.begun:
                wait, what = self.config.idle_timeout, "sent no data between chunks"
            else:
                what = "reported progress, then sent no first token"

    async def lines(self, resp: aiohttp.ClientResponse, *, first_wait: float, total: float | None,
                    started: _Start | None = None) -> AsyncIterator[list[bytes]]:
        """Non-empty lines of the body (NDJSON or SSE), as soon as they are complete: all those that arrived
        together in one list, so the layers above wake once per read, not once per line. The start of a line is
        kept in pieces until its end comes: joined at every read, a 16 MiB event (a file in a tool call) took 4.3 s
        of the event loop, which no other request got meanwhile."""
        start: list[bytes] = []
        async for data in self.reads(resp, first_wait, total, started):
            if data.find(b"\n") < 0:  # not `in`, which raises and clears a TypeError first (`_loads`)
                start.append(data)
                continue
            first, *complete, rest = data.split(b"\n")
            complete = [line for line in (b"".join([*start, first]), *complete) if line.strip()]
            start = [rest]
            if complete:
                yield complete
        if (last := b"".join(start)).strip():
            yield [last]

    async def read_json(self, resp: aiohttp.ClientResponse, wait: float) -> Any:
        return self._loads(b"".join([data async for data in self.reads(resp, wait, wait)]))

    def _loads(self, data: bytes) -> Any:
        """An answer's JSON, integers past 64 bits whole where they can be: in a tool call's `arguments`, the one
        place a backend writes a model's numbers as JSON numbers (Ollama's objects; OpenAI's are a string). Read
        whole everywhere, each streamed event paid exact_json's scan: 11% of a 256-piece stream's req/s. `find`, not
        `in`: Python 3.11's `bytes in bytes` first tries the needle as an integer, raising and clearing a TypeError
        each event (a 256-piece stream's 25,580 thousand instructions -> 25,340, callgrind)."""
        try:
            return loads(data) if data.find(b'"arguments"') >= 0 else orjson.loads(data)
        except orjson.JSONDecodeError as e:
            error = BackendError(self.scrubbed(f"backend {self.config.name!r} sent invalid JSON: {data[:200]!r}"))
            error.quotes_answer = True  # what it sent may be the model's text
            raise error from e

    def shaped(self, parse: Callable[[Any], T], obj: Any, path: str) -> T:
        """`parse(obj)`, where an answer of the wrong shape (a field missing or of another type) is a 502."""
        try:
            return parse(obj)
        except VeloError as e:  # an error line a parser read (Ollama's mid-stream `error`) may quote the key
            e.message = self.scrubbed(e.message)
            e.args = (e.message,)
            raise
        except _SHAPE_ERRORS as e:
            raise BackendError(self.scrubbed(f"backend {self.config.name!r} sent an answer to {path} of an "
                                             f"unexpected shape ({type(e).__name__}: {e})")) from e

    async def call(self, method: str, path: str, body: Any = None, *, model: str | None = None,
                   parse: Callable[[Any], T] = _as_is, wait: float | None = None) -> T:
        """A plain request/response call (listing, show, embeddings): the answer through `parse`, whole within `wait`
        (default `total_timeout`; a step before a generation, such as tokenizing its prompt, passes
        `first_token_timeout`: a stalled server held such a request for `total_timeout`)."""
        wait = self.config.total_timeout if wait is None else wait
        async with self.request(method, path, body, wait=wait, model=model) as resp:
            return self.shaped(parse, await self.read_json(resp, wait), path)

    def embedding_wait(self, inputs: int) -> float:
        """How long an embedding call may take: its answer comes whole, so there is no first token to time, but each
        input is a prompt to read, which `first_token_timeout` bounds for a generation; so that much an input, within
        `total_timeout`. A hung server held a one-input call (a search query's) for `total_timeout`, 1,800 s."""
        return min(self.config.total_timeout, self.config.first_token_timeout * max(1, inputs))

    def generation(self, path: str, body: dict[str, Any], *, model: str, parse: Callable[[Any], T | None],
                   whole: Callable[[Any], T | None] | None = None, ndjson: bool = False,
                   last: Callable[[T], bool] | None = None,
                   progress: Callable[[Any], bool] = _never) -> AsyncIterator[T]:
        """What a generation sends back, each through `parse` (None from it: nothing sent): the events of its stream
        (SSE, or NDJSON for Ollama) up to the one `last` recognises, under the first-token, idle and total timeouts
        (events `progress` knows as prompt progress only keep the first-token wait going); or, when `body` asks for
        no stream (`always_stream = false`), the whole answer once, through `whole` (default `parse`).

        The request is held by the events' own generator (`_events`), not by one of its own around it that every
        event went through: a 256-piece stream's 25,182 -> 25,038 thousand instructions a request (~560 an event),
        a short chat's 2,211 -> 2,200 (bench/proxy_instructions.py, the mean of runs under PYTHONHASHSEED 0, 1, 2:
        the seed moves a count by up to 1%)."""
        cfg = self.config
        if not body["stream"]:
            return self._whole(path, body, model, whole or parse)
        opened = self.request("POST", path, body, wait=cfg.first_token_timeout, model=model)
        return self._events(opened, self._loads if ndjson else self._sse_payload, first_wait=cfg.first_token_timeout,
                            total=cfg.total_timeout, parse=parse, started=_Start(progress), last=last)

    async def _whole(self, path: str, body: dict[str, Any], model: str,
                     parse: Callable[[Any], T | None]) -> AsyncIterator[T]:
        if (item := await self.call("POST", path, body, model=model, parse=parse)) is not None:  # as `_events`
            yield item

    def ndjson(self, resp: aiohttp.ClientResponse, *, first_wait: float, total: float | None,
               parse: Callable[[Any], T] = _as_is, started: _Start | None = None) -> AsyncIterator[T]:
        """Each line's JSON through `parse`."""
        return self._events(nullcontext(resp), self._loads, first_wait=first_wait, total=total,
                            parse=parse, started=started)

    async def _events(self, opened: AbstractAsyncContextManager[aiohttp.ClientResponse],
                      payload: Callable[[bytes], Any], *, first_wait: float, total: float | None,
                      parse: Callable[[Any], T | None], started: _Start | None,
                      last: Callable[[T], bool] | None = None) -> AsyncIterator[T]:
        """The body's lines read as `payload` reads each (`_SKIPPED`: nothing), through `parse` (None: nothing to
        send, the event taken in by the parser, as a one-answer fold takes them all), up to the item `last`
        recognises, from the response `opened` gives: closing this closes it, which cancels the upstream's work."""
        async with opened as resp:
            path = resp.url.path  # read once, and `note` called only until the answer begins: 0.7% of a short request
            async for lines in self.lines(resp, first_wait=first_wait, total=total, started=started):
                for line in lines:
                    if (obj := payload(line)) is _SKIPPED:
                        continue
                    if started is not None and not started.begun:
                        started.note(obj)
                    if (item := self.shaped(parse, obj, path)) is None:
                        continue
                    yield item
                    if last is not None and last(item):
                        return

    def _sse_payload(self, line: bytes) -> Any:
        """An SSE line's JSON payload: `_SKIPPED` for `[DONE]`, comments and other fields; an `error:` event, or a
        payload that is an error, raises."""
        field, _, value = line.partition(b":")
        value = value.strip()
        if field == b"error":
            raise BackendError(f"backend {self.config.name!r} failed mid-stream: "
                               f"{self.scrubbed(error_message(value))}")
        if field != b"data" or value == b"[DONE]":
            return _SKIPPED
        obj = self._loads(value)
        if isinstance(obj, dict) and "error" in obj:
            raise BackendError(f"backend {self.config.name!r} failed mid-stream: "
                               f"{self.scrubbed(error_message(value))}")
        return obj
