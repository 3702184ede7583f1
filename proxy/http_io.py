"""Reading request bodies, making jobs of them, and writing JSON, NDJSON and SSE answers.

A stream's first chunk is awaited before any byte is sent, so a backend that fails early gives a proper HTTP
error status; only a stream with nothing to send for `server.heartbeat_s` (a queue, a prompt read for minutes on a
CPU, a tool call held back while it is written) sends its headers sooner, with the dialect's empty event, and then
that event as often, so that no client or proxy read timeout ends it (300 s in the Agents SDK and Node's fetch, 60 s
in nginx). After the first byte, whatever fails (the backend, a malformed upstream event, Velo itself, an admin's
cancel, a shutdown) ends the stream with the dialect's error event and the stream's proper end: a second HTTP
response is never written into an open stream. Whatever happens, the backend stream is closed, which cancels the
backend's work.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import orjson
from aiohttp import web

from adapters.errors import BadRequest, VeloError
from adapters.exact_json import dumps, loads
from adapters.fields import MAX_DEPTH, nests_deeper

from .auth import ANONYMOUS, CALLER
from .cache.policy import bypass_requested
from .dialects import dialect_of
from .inflight import ending_reason, uncancel
from .job import Job, Request
from .request_bounds import read_body
from .state import DOCUMENTS, GENERATION
from .streams import first_then_rest

log = logging.getLogger("velo.http")
STREAM = "velo.stream"  # request key: the stream response once its head is out (errors.py never answers twice)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
T = TypeVar("T")


# Bodies past this size are parsed in a thread, as JSON (`read_json`) and then in their dialect (`parse_body`). A 28 MB
# chat history (100,000 messages) held the event loop, and so every other client, for 348 ms: orjson 145, the
# exact-integer scan 95, the depth check 78; in a thread, 116 ms at most, orjson's share, as orjson holds the GIL while
# it parses (two phone photos as base64, 24 MB: 162 -> 103 ms). Its dialect's parse held it another 300-700 ms.
# A body under 1 MiB parses in a few ms, less than the hop to a thread is worth.
_PARSE_APART_BYTES = 1024 * 1024
_BODY_BYTES = "velo.body_bytes"  # request key: the size of the body `read_json` read


async def read_json(request: web.Request) -> Any:
    raw = await read_body(request, request[GENERATION].config.server.body_timeout_s)
    if not raw or raw.isspace():  # Ollama's handlers, on the io.EOF of gin's ShouldBindJSON: "missing request body"
        ollama = dialect_of(request.path, request.headers) == "ollama"
        raise BadRequest("missing request body" if ollama else "request body is empty; expected a JSON object")
    request[_BODY_BYTES] = len(raw)
    return await asyncio.to_thread(_parsed, raw) if len(raw) > _PARSE_APART_BYTES else _parsed(raw)


def parse_body(request: web.Request, parse: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]:
    """`parse(*args, **kwargs)`, a dialect's parse of the body `read_json` read: on the event loop, or on one of the
    app's `Documents` threads where the body is large or the parse meets a large PDF (dialects/documents.py). Not a
    coroutine itself: one frame less for every request."""
    return request.app[DOCUMENTS].parse(parse, *args, apart=_large(request), **kwargs)


def _large(request: web.Request) -> bool:
    """Whether the body `read_json` read is one to work on apart from the event loop."""
    return request.get(_BODY_BYTES, 0) > _PARSE_APART_BYTES


def _parsed(raw: bytes) -> Any:
    try:
        body = loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from e
    if nests_deeper(body):
        raise BadRequest(f"request body nests arrays and objects deeper than {MAX_DEPTH} levels")
    return body


def job_for(request: web.Request, req: Request, body: dict[str, Any]) -> Job:
    """The pipeline's job for a parsed request: who asks, in which dialect, whether they asked Velo to leave its
    cache alone, and whether its body was large (Job.large). A request with a key shares backends' prefix caches only
    with that key's (`prefix_scope`)."""
    caller = request[CALLER]
    req.prefix_scope = "" if caller.tenant == ANONYMOUS else caller.tenant
    return Job(req, caller, dialect_of(request.path, request.headers),
               cache_bypass=bypass_requested(request.headers, body), large=_large(request))


def ignored_tools_header(names: list[str]) -> dict[str, str]:
    """`X-Velo-Tools-Ignored`: the offered tools that need the vendor's servers, by the names the client gave them.
    A control character would end the header (aiohttp refuses CR and LF there: the answer was a 500), so those are
    spaces."""
    return {"X-Velo-Tools-Ignored": _CONTROL.sub(" ", ", ".join(names))} if names else {}


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json", headers=headers)


async def write_stream(request: web.Request, stream: AsyncIterator[Any], encode: Callable[[Any], bytes],
                       on_error: Callable[[VeloError], bytes | None | Awaitable[bytes]], content_type: str,
                       headers: Callable[[], dict[str, str]] = dict, trailer: bytes = b"",
                       finish: Callable[[], Awaitable[bytes]] | None = None,
                       streamed_errors: tuple[type[VeloError], ...] = (), heartbeat: Any = None,
                       ends: Callable[[Any], bool] | None = None) -> web.StreamResponse:
    """Streams `stream` item by item through `encode`; the first item is awaited before the headers (`headers()`,
    read then: the pipeline has decided the cache outcome by its first chunk) go out. A failure before that
    propagates (the error middleware answers in the dialect), unless it is one of `streamed_errors`, which the
    dialect reports inside its stream; after it, `on_error` ends the stream (awaited, where it stores the failure
    first), or, where it has no words for a failure (None: a whole answer passed on as it comes), the connection is
    cut before the body's end (`_end_with`).

    `heartbeat`: the item `encode` makes the dialect's empty event of, written (the headers first) whenever the
    stream has sent nothing for `server.heartbeat_s`, by a timer beside the handler's task: the pipeline stays in
    that task, whose cancelling is how a newer autocomplete and an admin's cancel stop it.

    `ends`: whether an item ends the answer. What the pipeline does after that item (the cache's store) writes
    nothing: no heartbeat, and an error is logged, not sent. A client got heartbeats, or an error event that the
    SDKs raise, after its answer had ended."""
    server = request[GENERATION].config.server
    out = _Out(request, lambda: web.StreamResponse(headers={"Content-Type": content_type,
                                                            "Cache-Control": "no-cache", **headers()}),
               server.send_timeout_s)
    try:
        return await _pump(out, stream, encode, on_error, trailer, finish, streamed_errors, heartbeat, ends,
                           server.heartbeat_s if heartbeat is not None else 0)
    finally:
        out.unwatch()


async def _pump(out: _Out, stream: AsyncIterator[Any], encode: Callable[[Any], bytes],
                on_error: Callable[[VeloError], bytes | None | Awaitable[bytes]], trailer: bytes,
                finish: Callable[[], Awaitable[bytes]] | None, streamed_errors: tuple[type[VeloError], ...],
                heartbeat: Any, ends: Callable[[Any], bool] | None, every: float) -> web.StreamResponse:
    """`write_stream`'s work, through `out`, whose every write to the client is watched."""
    pump = _Pump(out, encode, ends, asyncio.create_task(out.beat(encode, heartbeat, every)) if every > 0 else None)
    try:
        try:
            await pump.items(stream, streamed_errors)
        finally:
            await pump.stop_beating()
        await pump.last(finish, trailer)
    except BaseException as e:
        err = _mid_stream(out.request, e) if out.resp is not None else None  # (which logs what failed)
        if err is None:
            raise
        if pump.ended:
            await _end_quietly(out, None if pump.finished else finish, None if pump.trailed else trailer)
        elif not await _end_with(out, on_error, err):
            return out.resp  # type: ignore[return-value]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    await out.end()
    return out.resp  # type: ignore[return-value]


@dataclass(slots=True)
class _Pump:
    """What `_pump`'s stages share about one stream: its heartbeats' timer, and how far the answer got (its end
    item encoded, `finish`'s bytes and the trailer written), which decides how a failure ends it. Slots, read in
    `encoded` for every piece, where a closure's cells were: a 256-piece stream's 22,920.6 -> 22,942.2 thousand
    instructions a request (+0.09%; repeats of one tree differ by 0.08%, bench/proxy_instructions.py --stream)."""

    out: _Out
    encode: Callable[[Any], bytes]
    ends: Callable[[Any], bool] | None
    beating: asyncio.Task[None] | None
    ended: bool = False
    finished: bool = False
    trailed: bool = False

    async def items(self, stream: AsyncIterator[Any], streamed_errors: tuple[type[VeloError], ...]) -> None:
        """The stream's items, each written as it is encoded; the head goes out once the first is had (or one of
        `streamed_errors` came instead, raised once the head is out, for the dialect to report in its stream). A
        failure after the end item is logged, not sent."""
        out, encoded, early = self.out, self.encoded, None
        try:
            first, rest = await first_then_rest(stream)
        except streamed_errors as e:
            first, rest, early = None, stream, e
        await out.open()
        if early is not None:
            raise early
        if first is not None and (data := encoded(first)) is not None:
            await out.write(data)
        try:
            async for item in rest:
                if (data := encoded(item)) is not None:
                    await out.write(data)
        except Exception as e:
            if not self.ended:
                raise
            _after_the_end(out.request, e)

    def encoded(self, item: Any) -> bytes | None:
        """An item's bytes, or None once the end item was encoded. A plain function, not a coroutine: one a piece was
        0.9% of a stream (24,045 -> 23,828 thousand)."""
        if self.ended:  # the timer stops before the end is written: a client reading slowly holds that write,
            return None  # and a heartbeat meanwhile followed the end (an Ollama line `done: false` after
        data = self.encode(item)  # `done: true`); `ends` may read what encoding the item told the dialect's writer
        ends = self.ends
        if ends is not None and ends(item):
            self.ended = True
            if self.beating is not None:
                self.beating.cancel()
        return data

    async def stop_beating(self) -> None:
        """The heartbeats' timer stopped, and done, before the answer's last bytes (or its error) are written."""
        if self.beating is not None:
            self.beating.cancel()
            await asyncio.wait([self.beating])

    async def last(self, finish: Callable[[], Awaitable[bytes]] | None, trailer: bytes) -> None:
        """The answer's last bytes: `finish`'s (the usage chunk an OpenAI client asked for), then the trailer."""
        out = self.out
        await out.open()
        if finish is not None:
            data = await finish()
            self.finished = True  # a write's bytes are the response's before it awaits anything (`_Out`)
            await out.write(data)
        self.trailed = True
        await out.write(trailer)


async def _end_quietly(out: _Out, finish: Callable[[], Awaitable[bytes]] | None, trailer: bytes | None) -> None:
    """An answer that had ended when what followed failed (an admin's cancel, a shutdown, `finish` itself): its end,
    no error. `finish` and `trailer` where not yet written: the usage chunk an OpenAI client asked for, if it can be
    had, then the dialect's last bytes."""
    if finish is not None:
        with contextlib.suppress(Exception):
            data = await finish()
            await out.write(data)
    if trailer is not None:
        await out.write(trailer)


def _after_the_end(request: web.Request, e: BaseException) -> None:
    log.warning("%s failed after its answer ended: %s", request.path,
                e.logged(answers=False) if isinstance(e, VeloError) else repr(e))


@dataclass
class _Out:
    """One stream's response, written by the stream and by the heartbeats' timer. A write's bytes join the response's
    buffer before it awaits anything (aiohttp's StreamWriter.write), so an item encoded and written at once goes out
    in the order it was encoded, whoever wrote it: Anthropic's and the Responses API's writers number their events."""

    request: web.Request
    head: Callable[[], web.StreamResponse]
    send_timeout: float  # server.send_timeout_s
    resp: web.StreamResponse | None = None  # once its head is out
    opening: asyncio.Lock = field(default_factory=asyncio.Lock)
    last: float = field(default_factory=time.monotonic)  # when something was last written (or the stream began)
    # when the oldest write still waiting for the client began: a heartbeat written meanwhile goes into the buffer
    # at once (aiohttp waits for the client past 64 KiB only), and clearing this it kept that client for good
    sending: float | None = None
    watch: asyncio.TimerHandle | None = None

    async def open(self) -> web.StreamResponse:
        """The response, its head sent once, by whichever comes first: the stream's first item or a heartbeat."""
        async with self.opening:
            if self.resp is None:
                resp = self.head()
                await resp.prepare(self.request)
                self.resp = self.request[STREAM] = resp
                self._watch()
        return self.resp

    async def write(self, data: bytes) -> None:
        self.last = time.monotonic()
        waits = self.sending is None  # a write made while another waits (a heartbeat's) leaves that one timed
        if waits:
            self.sending = self.last
        await self.resp.write(data)  # type: ignore[union-attr]
        if waits:
            self.sending = None

    async def end(self) -> None:
        waits = self.sending is None
        if waits:
            self.sending = time.monotonic()
        await self.resp.write_eof()  # type: ignore[union-attr]
        if waits:
            self.sending = None

    def _watch(self) -> None:
        """A client that has taken nothing for `send_timeout` while a write waits for it is gone: its connection is
        dropped, which ends the write and cancels the handler, and so the backend's work. One timer a stream, not one
        a write: a timer armed per read was 2.6% of the proxy's time (adapters/http.py `reads`)."""
        now = time.monotonic()
        if self.sending is not None and now - self.sending >= self.send_timeout:
            log.warning("%s: the client took nothing of the stream for %gs; its connection is closed",
                        self.request.path, self.send_timeout)
            if self.request.transport is not None:
                self.request.transport.abort()  # close() would wait, for good, for the client to take the rest
            return
        self.watch = asyncio.get_running_loop().call_later((self.sending or now) + self.send_timeout - now, self._watch)

    def unwatch(self) -> None:
        if self.watch is not None:
            self.watch.cancel()

    async def beat(self, encode: Callable[[Any], bytes], heartbeat: Any, every: float) -> None:
        """`heartbeat` written whenever `every` seconds passed without a write, until cancelled or the client left."""
        while True:
            await asyncio.sleep(self.last + every - time.monotonic())
            if time.monotonic() - self.last < every:
                continue
            try:
                await self.open()
                await self.write(encode(heartbeat))
            except ConnectionResetError:  # the client left: its handler is cancelled, and stops this timer
                return


def _mid_stream(request: web.Request, e: BaseException) -> VeloError | None:
    """The error to end an open stream with, or None when the stream cannot go on (the client left)."""
    if isinstance(e, asyncio.CancelledError):
        reason = ending_reason(request)
        if reason is not None:
            uncancel()
        return reason
    if isinstance(e, ConnectionResetError) or not isinstance(e, Exception):
        return None
    if isinstance(e, VeloError):  # the request log has the message, with the answer's text only with log_prompts
        log.warning("stream for %s failed mid-way: %s", request.path, e.logged(answers=False))
        return e
    log.exception("stream for %s failed mid-way", request.path)
    return VeloError("internal error in Velo; see its log")


async def _end_with(out: _Out, on_error: Callable[[VeloError], bytes | None | Awaitable[bytes]],
                    err: VeloError) -> bool:
    """The dialect's error event, and True: the stream's end follows (a complete chunked body: the connection stays
    usable, as a client that pooled it expects). Where the body cannot say it failed (`on_error` gives None: a whole
    JSON answer passed on as it comes), False: the connection closes before the body's end, so the client's read
    fails, as behind nginx when its upstream closes early; ended, the cut answer looked whole (a 200)."""
    request = out.request
    try:
        event = on_error(err)
        if inspect.isawaitable(event):
            event = await event
    except Exception:  # noqa: BLE001 - a writer that cannot word the error still ends the stream
        log.exception("the %s stream's error event could not be written", request.path)
        return True
    if event is None:
        if request.transport is not None:
            request.transport.close()  # what was written goes out first; the last chunk never does
        return False
    await out.write(event)
    return True


def ndjson(obj: Any) -> bytes:
    return dumps(obj) + b"\n"


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
