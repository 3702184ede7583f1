"""Hypothesis fuzzing of every route: random and near-valid bodies in both dialects must never produce a 500
nor hang. The app runs once, on its own loop in a thread; each example is a real HTTP request with a deadline."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Iterator

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.app import make_app
from proxy.config import Config
from tests.scripted import ScriptedBackend

DEADLINE_S = 10.0


class Served:
    """The Velo app on a background event loop, with one client session there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.routes, self.base = self.call(self._start())

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(DEADLINE_S)  # a hang fails here

    async def _start(self) -> tuple[list[tuple[str, str]], str]:
        app = make_app(Config(), {"s": ScriptedBackend("s", models=("tiny:latest", "other:7b"))})
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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(data=st.data(), body=bodies, head=headers)
def test_no_route_answers_500_or_hangs(served: Served, data: st.DataObject, body: bytes | None,
                                       head: dict[str, str]) -> None:
    method, path = data.draw(st.sampled_from(served.routes) | st.tuples(
        st.sampled_from(["GET", "POST", "PUT", "DELETE"]), st.sampled_from(["/api/nope", "/v1/x", "/api/chat"])))
    status, answer = served.call(served.request(method, path, body, head))
    assert status != 500 and status < 600, (method, path, body, status, answer[:300])
    if path.startswith("/v1/") and status >= 400:
        assert "error" in orjson.loads(answer), answer[:300]  # errors keep the dialect's shape
