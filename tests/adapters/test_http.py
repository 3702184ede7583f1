"""Upstream plumbing details that no fake server shows by itself: when a request may be sent again, and how a
stream becomes one answer."""
import asyncio
import re
from typing import Any, AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from adapters.base import BackendConfig
from adapters.errors import BackendError, BackendTimeout, BackendUnavailable, BadRequest, ContextOverflow
from adapters.http import Upstream, one_answer
from adapters.protocol import ChatRequest, Chunk, Message, TokenLogprob, ToolCall, Usage, aggregate

ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok": 123}'


async def serve(answers: list[bool]) -> tuple[asyncio.Server, list[int]]:
    """A server that reads each request whole, then answers it or (False) hangs up: a backend that took the
    request and crashed on it. Returns the server and the count of requests it read."""
    read = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)  # the `{}` body
            except asyncio.IncompleteReadError:  # the client closed the connection
                return
            read[0] += 1
            if not answers.pop(0):
                writer.close()
                return
            writer.write(ANSWER)

    return await asyncio.start_server(handle, "127.0.0.1", 0), read


def upstream(server: asyncio.Server) -> Upstream:
    port = server.sockets[0].getsockname()[1]
    return Upstream(BackendConfig(name="b", kind="openai", urls=[f"http://127.0.0.1:{port}"]))


@pytest.mark.parametrize("body, tokens, limit", [
    ({"object": "error", "type": "BadRequestError", "param": None, "code": 400,
      "message": "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2000 in the "
                 "messages, 100 in the completion). Please reduce the length of the messages or completion."},
     2100, 2048),
    ({"object": "error", "message": "This model's maximum context length is 2048 tokens. However, you requested 2200 "
                                    "tokens (2100 in the messages, 100 in the completion). Please reduce the length "
                                    "of the messages or completion."}, 2100, 2048),  # the prompt alone overflows
    ({"error": {"type": "BadRequestError", "param": "input_tokens", "code": 400,
                "message": "This model's maximum context length is 2048 tokens. However, you requested 100 output "
                           "tokens and your prompt contains at least 2001 input tokens, for a total of at least 2101 "
                           "tokens. Please reduce the length of the input prompt or the number of requested output "
                           "tokens. (parameter=input_tokens, value=2001)"}}, 2101, 2048),
    ({"object": "error", "message": "This model's maximum context length is 2048 tokens. However, your request has "
                                    "2100 input tokens. Please reduce the length of the input messages."}, 2100, 2048),
    ({"object": "error", "message": "Requested token count exceeds the model's maximum context length of 2048 tokens. "
                                    "You requested a total of 2100 tokens: 2000 tokens from the input messages and "
                                    "100 tokens for the completion. Please reduce the number of tokens in the input "
                                    "messages or the completion to fit within the limit."}, 2100, 2048),
    ({"object": "error", "message": "Input length (2100 tokens) exceeds the maximum allowed length (2048 tokens). Use "
                                    "a shorter input or enable --allow-auto-truncate."}, 2100, 2048),
    # OpenAI's own words, as an upstream that speaks as OpenAI does (another Velo too) sends them: a plain 400 it was
    ({"error": {"message": "This model's maximum context length is 2048 tokens. However, your messages resulted in "
                           "2100 tokens. Please reduce the length of the messages.", "type": "invalid_request_error",
                "param": "messages", "code": "context_length_exceeded"}}, 2100, 2048)])
async def test_vllms_and_sglangs_overflow_sentences_are_velos(aiohttp_server, body, tokens, limit):
    """vLLM (its wordings over the versions), SGLang and OpenAI say their counts only in words; read, they become the
    overflow each dialect words as its agents recognise, where a plain 400 stopped Claude Code and Codex."""
    up = await refusing(aiohttp_server, "openai", {"/v1/chat/completions": body, "/v1/completions": body})
    try:
        for path, field in (("/v1/chat/completions", "messages"), ("/v1/completions", "prompt")):
            with pytest.raises(ContextOverflow) as e:
                await up.call("POST", path, {})
            # OpenAI's `param` of a completion's overflow is its prompt: it named `messages`, which it has not
            assert (e.value.tokens, e.value.limit, e.value.param) == (tokens, limit, field)
    finally:
        await up.close()


async def refusing(aiohttp_server, kind: str, answers: dict[str, dict]) -> Upstream:
    """An Upstream of `kind` to a server whose every path answers its body with a 400."""
    app = web.Application()
    for path, body in answers.items():
        app.router.add_post(path, lambda request, body=body: web.json_response(body, status=400))
    server = await aiohttp_server(app)
    return Upstream(BackendConfig(name="b", kind=kind, urls=[str(server.make_url(""))]))


async def test_llama_servers_context_overflow_is_velos(aiohttp_server):
    """llama-server's 400 "exceed_context_size_error" carries its counts: it becomes the overflow every dialect words
    as its clients recognise (it was a plain 400, which agents do not compact on); other 400s stay plain."""
    up = await refusing(aiohttp_server, "llamacpp", {
        "/overflow": {"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 1331,
                                "n_ctx": 1024, "message": "request (1331 tokens) exceeds the available context size "
                                "(1024 tokens), try increasing it"}},
        "/other": {"error": {"code": 400, "type": "invalid_request_error", "message": "bad"}}})
    try:
        with pytest.raises(ContextOverflow) as e:
            await up.call("POST", "/overflow", {})
        assert (e.value.tokens, e.value.limit, e.value.code) == (1331, 1024, "context_length_exceeded")
        with pytest.raises(BadRequest) as plain:
            await up.call("POST", "/other", {})
        assert not isinstance(plain.value, ContextOverflow) and "bad" in plain.value.message
    finally:
        await up.close()


async def test_a_cookie_one_answer_sets_never_goes_out_with_another_request(aiohttp_server):
    """Velo's session is shared by every client and key: a cookie a backend (or the gateway before it) sets for one
    request must not go out with the next, someone else's."""
    cookies: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        cookies.append(request.headers.get("Cookie", ""))
        response = web.json_response({"ok": True})
        response.set_cookie("session", f"of-request-{len(cookies)}")
        return response

    app = web.Application()
    app.router.add_post("/v1/embeddings", answer)
    server = await aiohttp_server(app)
    # by host name: aiohttp's default jar ignores cookies from a bare IP address, not from a name
    up = Upstream(BackendConfig(name="b", kind="openai", urls=[f"http://localhost:{server.port}"]))
    try:
        for _ in range(2):
            assert await up.call("POST", "/v1/embeddings", {}) == {"ok": True}
        assert cookies == ["", ""]
    finally:
        await up.close()


async def test_no_message_quotes_the_backends_key_or_password():
    """aiohttp's errors carry the request's headers: a malformed answer put `Authorization: Bearer <api_key>` in the
    502 every client read (and in the log). A password in the url stays out of messages too."""
    async def malformed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")  # not a chunk size
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(malformed, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    keyed = Upstream(BackendConfig(name="b", kind="openai", urls=[f"http://127.0.0.1:{port}"], api_key="sk-SECRET"))
    gone = Upstream(BackendConfig(name="b", kind="ollama", urls=["http://velo:pa55word@127.0.0.1:9"]))
    try:
        with pytest.raises(BackendError) as failed:
            await keyed.call("GET", "/v1/models")
        with pytest.raises(BackendUnavailable) as unreachable:
            await gone.call("GET", "/api/tags")
        assert "chunk" in failed.value.message and "127.0.0.1:9" in unreachable.value.message
        for message in (failed.value.message, unreachable.value.message):
            assert "sk-SECRET" not in message and "Authorization" not in message and "pa55word" not in message
    finally:
        await keyed.close()
        await gone.close()
        server.close()


@pytest.mark.parametrize("kind,body", [
    ("openai", b'data: {"error": {"message": "token sk-SECRET expired"}}\n\n'),  # vLLM's mid-stream error
    ("openai", b"error: sk-SECRET expired\n\n"),
    ("openai", b"data: {oops sk-SECRET\n\n"),  # not JSON: quoted in the 502
    ("ollama", b'{"error": "token sk-SECRET expired"}\n'),  # Ollama's mid-stream error line
])
async def test_no_error_a_backend_sends_mid_stream_quotes_its_key(aiohttp_server, kind, body):
    """Error statuses were scrubbed, but a message built from what came in a stream quoted the key to the client
    and to the log."""
    from adapters.registry import make_backend

    async def answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(body)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_post("/api/chat", answer)
    server = await aiohttp_server(app)
    backend = make_backend(BackendConfig(name="b", kind=kind, urls=[str(server.make_url(""))], api_key="sk-SECRET"))
    try:
        with pytest.raises(BackendError) as e:
            [c async for c in backend.chat(ChatRequest(model="m", messages=[Message(role="user", content="hi")]))]
        assert "sk-SECRET" not in e.value.message and "sk-SECRET" not in str(e.value) and "***" in e.value.message
    finally:
        await backend.close()


async def test_a_redirect_is_a_clear_502_never_followed(aiohttp_server):
    """Followed, a 302 made a POST a GET without its body (the client read a 405, or a misleading 404 "model not
    found" from an Ollama moved to https), and a 307 sent the prompt on to wherever it pointed."""
    followed = []

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/elsewhere")

    async def elsewhere(request: web.Request) -> web.Response:
        followed.append(request.method)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/api/chat", moved)
    app.router.add_route("*", "/elsewhere", elsewhere)
    server = await aiohttp_server(app)
    up = Upstream(BackendConfig(name="b", kind="ollama", urls=[str(server.make_url(""))]))
    try:
        with pytest.raises(BackendError) as e:
            await up.call("POST", "/api/chat", {"model": "m"}, model="m")
        assert e.value.status == 502 and "redirected /api/chat to /elsewhere (307)" in e.value.message
        assert followed == []
    finally:
        await up.close()


async def test_llama_servers_500_for_an_image_is_the_requests_400(aiohttp_server):
    """llama-server without a projector answers an image with a 500, which every SDK retried three times as Velo's
    502; it is Ollama's 400 "does not support vision". So is a body it cannot read (a field of the wrong type, or
    missing), which its own routes' clients send through Velo as they are. Other 500s stay the backend's."""
    async def refuse(request: web.Request) -> web.Response:
        message = {"/v1/chat/completions": "image input is not supported - hint: if this is unexpected, you may "
                                           "need to provide the mmproj",
                   "/tokenize": "[json.exception.type_error.302] type must be string, but is null"}.get(
                       request.path, "out of memory")
        return web.json_response({"error": {"code": 500, "message": message, "type": "server_error"}}, status=500)

    app = web.Application()
    app.router.add_post("/{path:.*}", refuse)
    server = await aiohttp_server(app)
    up = Upstream(BackendConfig(name="b", kind="llamacpp", urls=[str(server.make_url(""))]))
    try:
        with pytest.raises(BadRequest) as lacks:
            await up.call("POST", "/v1/chat/completions", {}, model="smollm2")
        assert lacks.value.status == 400 and lacks.value.message == '"smollm2" does not support vision'
        with pytest.raises(BadRequest) as unread:
            await up.call("POST", "/tokenize", {"content": None})
        assert unread.value.status == 400 and "type must be string, but is null" in unread.value.message
        with pytest.raises(BackendError) as failed:
            await up.call("POST", "/completion", {}, model="smollm2")
        assert failed.value.status == 502
    finally:
        await up.close()


async def test_a_stream_is_asked_uncompressed_so_its_events_come_as_they_are_written(aiohttp_server):
    """A gzip between Velo and the backend (nginx's `gzip on` for text/event-stream) sends a compressed stream only
    when its buffer fills: here, only after the client has read the first event, which it then never gets."""
    first_read = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            response.enable_compression(web.ContentCoding.gzip)
        await response.prepare(request)
        await response.write(b'data: {"n": 1}\n\n')
        await asyncio.wait_for(first_read.wait(), 5)
        await response.write(b'data: {"n": 2}\n\n')
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    server = await aiohttp_server(app)
    up = Upstream(BackendConfig(name="b", kind="openai", urls=[str(server.make_url(""))]))
    try:
        events = up.generation("/v1/chat/completions", {"stream": True}, model="m", parse=lambda obj: obj["n"])
        assert await asyncio.wait_for(events.__anext__(), 3) == 1
        first_read.set()
        assert [n async for n in events] == [2]
    finally:
        await up.close()


async def test_a_model_that_loads_too_long_is_a_clear_503_and_listing_never_waits(aiohttp_server):
    """A request waits for a loading model (llama-server's 503 "Loading model") at most `first_token_timeout`, then
    fails saying so; a GET (listing, /props) is answered at once, as Ollama lists while it loads."""
    asked = {"GET": 0, "POST": 0}

    async def loading(request: web.Request) -> web.Response:
        asked[request.method] += 1
        return web.json_response({"error": {"code": 503, "type": "unavailable_error", "message": "Loading model"}},
                                 status=503)

    app = web.Application()
    app.router.add_route("*", "/v1/models", loading)
    server = await aiohttp_server(app)
    up = Upstream(BackendConfig(name="b", kind="llamacpp", urls=[str(server.make_url(""))], first_token_timeout=0.6))
    try:
        with pytest.raises(BackendUnavailable, match="still loading its model"):
            await up.call("GET", "/v1/models")
        assert asked == {"GET": 1, "POST": 0}
        started = asyncio.get_running_loop().time()
        with pytest.raises(BackendUnavailable, match="still loading its model"):
            await up.call("POST", "/v1/models", {})
        assert asyncio.get_running_loop().time() - started < 2 and asked["POST"] >= 2  # asked again while it loads
    finally:
        await up.close()


async def test_a_request_the_backend_took_is_never_sent_again():
    """A backend that read the request and dropped the connection may have crashed on it: one try only."""
    server, read = await serve([True, False, True])
    up = upstream(server)
    try:
        assert await up.call("POST", "/x", {}) == {"ok": 123}
        with pytest.raises(BackendError, match="closed the connection on /x before answering"):
            await up.call("POST", "/x", {})  # on the kept-alive connection: taken, then dropped
        assert read[0] == 2
    finally:
        await up.close()
        server.close()


async def test_a_request_that_never_went_out_is_sent_once_more_on_a_fresh_connection():
    """A pooled connection found closed while the request was being written: nothing reached the backend."""
    server, read = await serve([True])
    up = upstream(server)

    class Closed:
        async def request(self, *args: Any, **kwargs: Any) -> Any:  # what aiohttp raises then
            closing = aiohttp.ClientConnectionResetError("Cannot write to closing transport")
            raise aiohttp.ClientOSError(None, "Can not write request body") from closing
    up.session = lambda: Closed()  # type: ignore[method-assign, assignment, return-value]
    try:
        assert await up.call("POST", "/x", {}) == {"ok": 123}
        assert read[0] == 1
    finally:
        await up.close()
        server.close()


async def serve_pieces(pieces: list[bytes]) -> asyncio.Server:
    """A server that answers any request with a body sent in these pieces, each written and flushed apart."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(re.search(rb"(?i)content-length: *(\d+)", head)[1]))  # the request's body
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)  # so each piece arrives in a read of its own
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("pieces", [
    [b'data: {"n": 1}\n\ndata: {"n": 2}\n\n: a comment\n\ndata: [DONE]\n\n'],  # every event in one read
    [b'data: {"n"', b': 1}\n', b'\ndata: {"n": 2}\n\n: a com', b'ment\n\ndata: [DO', b'NE]'],  # split mid-line; no
])  # newline after the last line
async def test_sse_events_come_whole_and_in_order_however_the_body_is_cut(pieces: list[bytes]):
    """Lines that arrive together go up together and a line cut between reads waits for its end: the same
    events either way."""
    server = await serve_pieces(pieces)
    up = upstream(server)
    try:
        events = [e async for e in up.generation("/x", {"stream": True}, model="m", parse=lambda obj: obj)]
        assert events == [{"n": 1}, {"n": 2}]
    finally:
        await up.close()
        server.close()


async def test_one_answer_folds_a_stream_into_one_chunk_and_keeps_every_field():
    """A non-streamed client request: the backend's stream folded before the pipeline, with nothing lost."""
    call = ToolCall(name="f", arguments={"a": 1}, id="c0")
    lo = TokenLogprob("lo", -0.2, [TokenLogprob("lo", -0.2)])
    pieces = [Chunk(text="Hel", thinking="hm", logprobs=[TokenLogprob("Hel", -0.1)]),
              Chunk(text="lo", logprobs=[lo], tool_calls=[call]),
              Chunk(finish_reason="tool_calls", usage=Usage(prompt_tokens=3, completion_tokens=2), context=[1, 2])]

    async def stream() -> AsyncIterator[Chunk]:
        for c in pieces:
            yield c

    assert [c async for c in one_answer(stream())] == [aggregate(pieces)]
    assert aggregate(pieces) == Chunk(text="Hello", thinking="hm", tool_calls=[call], finish_reason="tool_calls",
                                      logprobs=[TokenLogprob("Hel", -0.1), lo],
                                      usage=Usage(prompt_tokens=3, completion_tokens=2), context=[1, 2])


async def test_one_answer_cancelled_closes_the_backend_stream():
    """The client left while its one answer was being gathered: the backend's stream is closed at once (which
    closes its connection, cancelling the generation)."""
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[Chunk]:
        try:
            while True:
                yield Chunk(text="w")
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    task = asyncio.ensure_future(one_answer(endless()).__anext__())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed.is_set()


async def _progress_then(aiohttp_server, gap_s: float, token: bool) -> Upstream:
    """A llama-server-like stream: a prompt-progress event, `gap_s` of silence, then (`token`) a token and the end."""
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"content": "", "stop": false, "prompt_progress": {"total": 9, "processed": 0}}\n\n')
        await asyncio.sleep(gap_s)
        if token:
            await resp.write(b'data: {"content": "hi", "stop": true}\n\n')
        await asyncio.sleep(5 if not token else 0)
        return resp

    app = web.Application()
    app.router.add_post("/completion", stream)
    server = await aiohttp_server(app)
    return Upstream(BackendConfig(name="b", kind="llamacpp", urls=[str(server.make_url(""))],
                                  first_token_timeout=1.0, idle_timeout=0.2))


def _is_progress(event: Any) -> bool:
    return "prompt_progress" in event


async def test_prompt_progress_keeps_the_first_token_wait_going(aiohttp_server):
    """A CPU reads a long prompt for minutes: llama-server's progress reports are proof of work, so the gap after
    one may take first_token_timeout (1 s here), not idle_timeout (0.2 s)."""
    up = await _progress_then(aiohttp_server, 0.5, token=True)
    try:
        got = [e async for e in up.generation("/completion", {"stream": True}, model="m", parse=lambda e: e,
                                              last=lambda e: e["stop"], progress=_is_progress)]
        assert [e["content"] for e in got] == ["", "hi"]
        with pytest.raises(BackendTimeout, match="sent no data between chunks within 0.2s"):
            [e async for e in up.generation("/completion", {"stream": True}, model="m", parse=lambda e: e)]
    finally:
        await up.close()


async def test_progress_without_a_token_ends_after_first_token_timeout(aiohttp_server):
    up = await _progress_then(aiohttp_server, 3, token=False)
    try:
        with pytest.raises(BackendTimeout, match="reported progress, then sent no first token within 1s"):
            [e async for e in up.generation("/completion", {"stream": True}, model="m", parse=lambda e: e,
                                            progress=_is_progress)]
    finally:
        await up.close()
