"""Hypothesis fuzzing of every route, from both sides: random and near-valid client bodies (nesting and size
extremes included) in every dialect, and random model answers and malformed upstream events through repair and
every dialect, streamed and not, must never produce a 500 nor hang, and a stream always ends in its dialect's way.
Each app runs once, on its own loop in a thread; each example is a real HTTP request with a deadline."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Iterator

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config
from tests.fakes import FakeOpenAI, FakeServer, OllamaDouble
from tests.proxy.test_stream_faults import stream_error
from tests.scripted import Script, ScriptedBackend

DEADLINE_S = 10.0
def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Served:
    """A Velo app (from `make`, run on the same loop) on a background event loop, with one client session there."""

    def __init__(self, make: Callable[[], Awaitable[web.Application]] | None = None) -> None:
        self.make = make or self._scripted
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.routes, self.base = self.call(self._start())

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(DEADLINE_S)  # a hang fails here

    async def _scripted(self) -> web.Application:
        return make_app(Config(), {"s": ScriptedBackend("s", models=("tiny:latest", "other:7b"))})

    async def _start(self) -> tuple[list[tuple[str, str]], str]:
        app = await self.make()
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.session = aiohttp.ClientSession()
        routes = sorted({(r.method, r.resource.canonical) for r in app.router.routes()  # type: ignore[union-attr]
                         if r.method != "HEAD"})
        return routes, "http://127.0.0.1:%d" % self.runner.addresses[0][1]

    async def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        async with self.session.request(method, self.base + path, data=body, headers=headers) as resp:
            return resp.status, await resp.read()

    def close(self) -> None:
        async def stop() -> None:
            await self.session.close()
            await self.runner.cleanup()
        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


def nested_json(depth: int) -> bytes:
    """Arrays and objects `depth` levels deep, written by hand: encoders refuse to write past a few hundred."""
    return b"".join(b'{"a": ' if n % 2 else b"[" for n in range(depth)) + b"1" + b"".join(
        b"}" if n % 2 else b"]" for n in reversed(range(depth)))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
models = st.sampled_from(["tiny", "tiny:latest", "other:7b", "", "nope"]) | st.text(max_size=12) | json_values
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]) | json_values,
     "content": st.text(max_size=30) | json_values},
    optional={"images": json_values, "tool_calls": json_values, "name": json_values}), max_size=3) | json_values
near_valid = st.fixed_dictionaries({"model": models}, optional={
    "messages": messages, "prompt": st.text(max_size=30) | json_values, "suffix": st.text(max_size=10),
    "input": st.text(max_size=20) | st.lists(st.text(max_size=10), max_size=4) | json_values,
    "stream": st.booleans() | json_values, "options": st.dictionaries(
        st.sampled_from(["temperature", "num_predict", "seed", "top_k", "stop", "num_ctx"]), json_values),
    "temperature": json_values, "max_tokens": json_values, "n": st.integers(-2, 3) | json_values,
    "tools": json_values, "format": json_values, "response_format": json_values, "stream_options": json_values,
    "keep_alive": json_values, "name": json_values, "source": json_values, "destination": json_values})
bodies = (near_valid.map(orjson.dumps) | json_values.map(orjson.dumps)
          | st.binary(max_size=40) | st.just(b"") | st.none())
headers = st.fixed_dictionaries({}, optional={
    "Authorization": st.sampled_from(["Bearer k", "Bearer ", "Basic x", "bearer"]),
    "X-Velo-Client": st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=8),
    "Content-Type": st.sampled_from(["application/json", "text/plain"])})


@fuzz(400)
@given(data=st.data(), body=bodies, head=headers)
def test_no_route_answers_500_or_hangs(served: Served, data: st.DataObject, body: bytes | None,
                                       head: dict[str, str]) -> None:
    method, path = data.draw(st.sampled_from(served.routes) | st.tuples(
        st.sampled_from(["GET", "POST", "PUT", "DELETE"]), st.sampled_from(["/api/nope", "/v1/x", "/api/chat"])))
    status, answer = served.call(served.request(method, path, body, head))
    assert status != 500 and status < 600, (method, path, body, status, answer[:300])
    if path.startswith("/v1/") and status >= 400:
        assert "error" in orjson.loads(answer), answer[:300]  # errors keep the dialect's shape


GENERATION = {  # path -> a body in that dialect, to which the fuzzed parts are added
    "/api/chat": {"messages": [{"role": "user", "content": "hi"}]},
    "/api/generate": {"prompt": "hi"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/messages": {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"input": "hi"},
}
FIELDS = ["tools", "tool_choice", "format", "options", "response_format", "messages", "input", "metadata", "stop"]


@fuzz(120)
@given(path=st.sampled_from(sorted(GENERATION)), field=st.sampled_from(FIELDS), depth=st.integers(0, 1100),
       size=st.sampled_from([0, 1, 1000, 200_000]), stream=st.booleans())
def test_nesting_and_size_extremes_are_4xx_or_served_never_500(served: Served, path: str, field: str, depth: int,
                                                                 size: int, stream: bool) -> None:
    head = orjson.dumps({"model": "tiny", "stream": stream, "note": "x" * size, **GENERATION[path]})
    body = head[:-1] + b', "' + field.encode() + b'": ' + nested_json(depth) + b"}"
    status, answer = served.call(served.request("POST", path, body, {"Content-Type": "application/json"}))
    assert status < 500, (path, field, depth, size, status, answer[:300])
    if depth > 64:
        assert status == 400, (path, field, depth, status, answer[:300])


# The model's side: answers made of the pieces small models write, broken anywhere, cut into chunks anywhere.
PIECES = st.sampled_from([
    "<tool_call>", "</tool_call>", '{"name": "get_weather", "arguments": ', '{"city": "Paris"}', "{", "}", "[", "]",
    '"', "'", "\\", "\\ud83d", "\\u00e9", "\U0001f600", "```json\n", "```", "\n", "<|python_tag|>",
    "<|eot_id|>", "[TOOL_CALLS]", "<function=get_weather>", "</function>", ",", ":", "city", '"days": "2"',
    "null", "True", "1e999", "NaN", "{'city': 'Oslo',}", " "]) | st.text(max_size=6)
ANSWERS = st.lists(PIECES, max_size=40).map("".join)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}
ASKS = {  # what the client asks for, per dialect: tools, JSON, a schema, or plain text
    "tools": {"/api/chat": {"tools": [WEATHER]}, "/v1/chat/completions": {"tools": [WEATHER]},
              "/v1/messages": {"tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]},
              "/v1/responses": {"tools": [{"type": "function", "name": "get_weather",
                                           "parameters": WEATHER["function"]["parameters"]}]}},
    "json": {"/api/chat": {"format": "json"}, "/api/generate": {"format": "json"},
             "/v1/chat/completions": {"response_format": {"type": "json_object"}},
             "/v1/responses": {"text": {"format": {"type": "json_object"}}}},
    "schema": {"/api/chat": {"format": WEATHER["function"]["parameters"]},
               "/v1/chat/completions": {"response_format": {"type": "json_schema", "json_schema": {
                   "name": "w", "schema": WEATHER["function"]["parameters"]}}}},
    "text": {path: {} for path in GENERATION},
}


class Answers:
    """A Velo over a scripted backend whose answer each example sets (the response cache is off: every example
    reaches the backend)."""

    def __init__(self) -> None:
        self.backend = ScriptedBackend("s", models=("tiny:latest",))

    async def make(self) -> web.Application:
        return make_app(Config(cache=CacheConfig(enabled=False)), {"s": self.backend})


@pytest.fixture(scope="module")
def answers() -> Iterator[tuple[Served, Answers]]:
    scripted = Answers()
    s = Served(scripted.make)
    yield s, scripted
    s.close()


def ends_well(path: str, stream: bool, status: int, body: bytes) -> None:
    """A whole answer is JSON; a stream ends in its dialect's way, with or without an error."""
    if status != 200 or not stream:
        orjson.loads(body)
        return
    stream_error(path, body)


@fuzz(300)
@given(data=st.data(), text=ANSWERS, cut=st.integers(1, 12), stream=st.booleans())
def test_fuzzed_model_answers_through_repair_and_every_dialect(answers: tuple[Served, Answers], data: st.DataObject,
                                                               text: str, cut: int, stream: bool) -> None:
    served, scripted = answers
    ask = data.draw(st.sampled_from(sorted(ASKS)))
    path = data.draw(st.sampled_from(sorted(ASKS[ask])))
    scripted.backend.script = Script(pieces=[text[i:i + cut] for i in range(0, len(text), cut)])
    body = orjson.dumps({"model": "tiny", "stream": stream, **GENERATION[path], **ASKS[ask][path]})
    status, answer = served.call(served.request("POST", path, body, {"Content-Type": "application/json"}))
    assert status in (200, 502), (path, ask, text, status, answer[:300])  # 502: a call or JSON that stays invalid
    ends_well(path, stream, status, answer)


UPSTREAM_EVENTS = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=8),
                               lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                                   st.sampled_from(["choices", "delta", "content", "message", "done", "index",
                                                    "tool_calls", "function", "name", "arguments", "usage",
                                                    "response", "error", "finish_reason", "text"]), inner,
                                   max_size=4), max_leaves=10)


class Upstreams:
    """A Velo in front of one OpenAI-kind and one Ollama-kind fake upstream, both started on Velo's loop."""

    async def make(self) -> web.Application:
        self.fakes: dict[str, FakeServer] = {"openai": await FakeOpenAI(models=["o"]).start(),
                                             "ollama": await OllamaDouble(models=["l"]).start()}
        app = make_app(Config(backends=[BackendConfig(name=k, kind=k, urls=[f.url]) for k, f in self.fakes.items()],
                              cache=CacheConfig(enabled=False)))
        app.on_cleanup.append(self.stop)
        return app

    async def stop(self, app: web.Application) -> None:
        for fake in self.fakes.values():
            await fake.stop()


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[Served, Upstreams]]:
    fakes = Upstreams()
    s = Served(fakes.make)
    yield s, fakes
    s.close()


@fuzz(200)
@given(kind=st.sampled_from(["openai", "ollama"]), path=st.sampled_from(sorted(GENERATION)), event=UPSTREAM_EVENTS,
       at=st.integers(0, 6), stream=st.booleans())
def test_fuzzed_upstream_events_never_give_a_500_or_a_broken_stream(upstreams: tuple[Served, Upstreams], kind: str,
                                                                    path: str, event: Any, at: int,
                                                                    stream: bool) -> None:
    served, fakes = upstreams
    fake = fakes.fakes[kind]
    line = orjson.dumps(event)
    fake.script.malformed = b"data: " + line + b"\n\n" if kind == "openai" else line + b"\n"
    fake.script.malformed_at = at
    body = orjson.dumps({"model": "o" if kind == "openai" else "l", "stream": stream, **GENERATION[path]})
    status, answer = served.call(served.request("POST", path, body, {"Content-Type": "application/json"}))
    assert status in (200, 502, 504), (kind, path, event, status, answer[:300])
    ends_well(path, stream, status, answer)
