"""Config reload without a restart: an edit of config.toml (or SIGHUP, in tests/integration/test_serve_reload.py)
swaps routes, aliases, backends, limits and cache settings; requests in flight finish on the old configuration; a
bad file is refused and the old configuration stays; what did not change stays open."""
from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from adapters.errors import BackendError, BadRequest
from adapters.openai_compat import OpenAIBackend
from proxy.app import make_app
from proxy.config import load_config
from proxy.state import GENERATIONS, RELOADER
from tests.engine.tiny import write_tiny_model
from tests.fakes import FakeOpenAI
from tests.proxy.test_metrics import scrape, value

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False,
        "options": {"temperature": 0}}


def toml(a: str, b: str, alias_to: str, extra: str = "") -> str:
    return f"""
{extra}
[aliases]
m = "{alias_to}:fake-gpt"

[[backends]]
name = "a"
kind = "openai"
url = "{a}"

[[backends]]
name = "b"
kind = "openai"
url = "{b}"
"""


@pytest.fixture
async def two_fakes():
    async with FakeOpenAI() as a, FakeOpenAI() as b:
        a.script.reply, b.script.reply = "from a", "from b"
        yield a, b


async def reloaded_app(path: Path) -> TestClient:
    app = make_app(load_config(path), config_path=path)
    return TestClient(TestServer(app, handler_cancellation=True))


async def answer(c: TestClient, body: dict = CHAT, **headers: str) -> str:
    resp = await c.post("/api/chat", json=body, headers=headers)
    assert resp.status == 200, await resp.text()
    return (await resp.json())["message"]["content"]


async def streamed(c: TestClient) -> str:
    resp = await c.post("/api/chat", json={**CHAT, "stream": True})
    assert resp.status == 200
    return "".join([json.loads(line)["message"]["content"] async for line in resp.content if line.strip()])


async def test_an_edit_of_the_file_reroutes_and_keeps_unchanged_backends_open(tmp_path, two_fakes):
    a, b = two_fakes
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a"))
    async with await reloaded_app(path) as c:
        app = c.server.app
        app[RELOADER].interval_s = 0.05
        first = app[GENERATIONS].current
        assert await answer(c) == "from a"
        path.write_text(toml(a.url, b.url, "b", extra='default_backend = "b"'))
        for _ in range(200):
            if app[GENERATIONS].current is not first:
                break
            await asyncio.sleep(0.05)
        second = app[GENERATIONS].current
        assert second.number == 2 and second.config.default_backend == "b"
        assert await answer(c) == "from b"
        assert second.backends["a"] is first.backends["a"] and second.backends["b"] is first.backends["b"]
        assert second.fresh == []  # nothing reopened
        await asyncio.sleep(0.1)
        assert not first.backends["a"].http._session.closed  # kept: still open for the new configuration
        assert value(await scrape(c), "velo_config_reloads_total", outcome="applied") == 1


async def test_a_file_being_written_is_read_once_it_settles(tmp_path, two_fakes):
    """An editor that truncates the file and then writes it leaves it cut for a moment; a poll that fell there read
    it: a cut file was refused (an empty one switched every request to the default backend) until the next poll."""
    a, b = two_fakes
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a"))
    async with await reloaded_app(path) as c:
        reloader = c.server.app[RELOADER]
        reloader.interval_s, reloader.settle_s = 0.02, 1.0
        await asyncio.sleep(1.1)  # the watcher's first wait, begun at the default interval, is over
        whole = toml(a.url, b.url, "b", extra='default_backend = "b"')
        path.write_text(whole[:whole.index('url = "') + 10])  # an unterminated string: not TOML
        await asyncio.sleep(0.2)
        path.write_text(whole)
        for _ in range(200):
            if reloader.applied or reloader.refused:
                break
            await asyncio.sleep(0.05)
        assert (reloader.applied, reloader.refused) == (1, 0), reloader.last_error
        assert await answer(c) == "from b"


async def test_a_request_in_flight_finishes_on_the_old_configuration(tmp_path, two_fakes):
    a, b = two_fakes
    a.script.reply, a.script.token_delay = "one two three four five six", 0.4
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a"))
    async with await reloaded_app(path) as c:
        app = c.server.app
        first = app[GENERATIONS].current
        streaming = asyncio.create_task(streamed(c))
        while not any(r.path == "/v1/chat/completions" for r in a.requests):
            await asyncio.sleep(0.01)
        # backend "a" leaves the config: its requests in flight still finish on it
        path.write_text(without_a(b.url))
        assert await app[RELOADER].reload()
        assert list(app[GENERATIONS].current.backends) == ["b"]
        assert await answer(c) == "from b"  # new requests: the new configuration
        assert first.in_flight == 1 and not first.backends["a"].http._session.closed
        assert await streaming == "one two three four five six"
        await asyncio.wait_for(asyncio.gather(*app[GENERATIONS].retiring), 5)
        assert first.backends["a"].http._session is None  # closed once its last request was done
        assert "b" in app[GENERATIONS].current.backends and app[GENERATIONS].current.backends["b"].http._session


@asynccontextmanager
async def routed_to_a(tmp_path: Path, a: FakeOpenAI, b: FakeOpenAI) -> AsyncIterator[tuple[TestClient, Path]]:
    """Velo over the two fakes, routing to "a", with the file it reloads."""
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a"))
    async with await reloaded_app(path) as c:
        yield c, path


def without_a(b: str) -> str:
    """The config with backend "a" gone."""
    return toml(b, b, "b").replace(f'name = "a"\nkind = "openai"\nurl = "{b}"\n\n[[backends]]\n', "")


async def test_a_bad_config_is_refused_with_its_error_logged_and_the_old_one_stays(tmp_path, two_fakes, caplog):
    a, b = two_fakes
    async with routed_to_a(tmp_path, a, b) as (c, path):
        app = c.server.app
        first = app[GENERATIONS].current
        for bad in ("[[backends]\nname =", toml(a.url, b.url, "a") + '\n[[routes]]\nmatch = "x"\nbackend = "nope"\n'):
            path.write_text(bad)
            with caplog.at_level(logging.ERROR, logger="velo.reload"):
                assert not await app[RELOADER].reload()
            assert app[GENERATIONS].current is first
            assert await answer(c) == "from a"
        assert "routes[0].backend: no backend named 'nope'" in caplog.text
        assert "config reload refused, configuration 1 stays in force" in caplog.text
        assert value(await scrape(c), "velo_config_reloads_total", outcome="refused") == 2


async def test_a_config_refused_while_its_backends_are_made_holds_nothing_back(tmp_path, two_fakes, monkeypatch):
    """A new backend whose adapter refuses to be made: the refused build had kept its hold on backend "a", so the
    reload that later dropped "a" never closed it."""
    def refused(cfg: BackendConfig, swaps: object = None) -> None:
        raise BadRequest(f"backend {cfg.name!r} cannot be made")

    a, b = two_fakes
    async with routed_to_a(tmp_path, a, b) as (c, path):
        app = c.server.app
        first = app[GENERATIONS].current
        monkeypatch.setattr("adapters.registry.make_backend", refused)
        path.write_text(toml(a.url, b.url, "a") + '[[backends]]\nname = "e"\nkind = "openai"\nurl = "http://h:1"\n')
        assert not await app[RELOADER].reload()
        assert app[RELOADER].last_error == "backend 'e' cannot be made"
        monkeypatch.undo()
        path.write_text(without_a(b.url))
        assert await app[RELOADER].reload()
        await asyncio.wait_for(asyncio.gather(*app[GENERATIONS].retiring), 5)
        assert first.backends["a"].http._session is None


async def test_a_reload_stopped_while_its_backends_start_closes_them_and_the_old_configuration_serves(
        tmp_path, two_fakes, monkeypatch, caplog):
    """Velo's stop cancels a reload under way (it loaded its new engine's model on through the shutdown's grace):
    what the reload made is closed and the configuration in force serves on. The log says the reload was abandoned
    and /metrics counts it (it ended without a word, counted nowhere)."""
    started, closed, close = asyncio.Event(), [], OpenAIBackend.close

    async def hangs(self: OpenAIBackend) -> None:  # as an engine's start does while its model loads
        if self.name == "e":
            started.set()
            await asyncio.Event().wait()

    async def closing(self: OpenAIBackend) -> None:
        closed.append(self.name)
        await close(self)
    a, b = two_fakes
    async with routed_to_a(tmp_path, a, b) as (c, path):
        app = c.server.app
        first = app[GENERATIONS].current
        monkeypatch.setattr(OpenAIBackend, "start", hangs)
        monkeypatch.setattr(OpenAIBackend, "close", closing)
        path.write_text(toml(a.url, b.url, "a") + '[[backends]]\nname = "e"\nkind = "openai"\nurl = "http://h:1"\n')
        app[RELOADER].trigger()
        await asyncio.wait_for(started.wait(), 5)
        with caplog.at_level(logging.WARNING, logger="velo.reload"):
            app[RELOADER].stop()
            for _ in range(500):
                if "e" in closed:
                    break
                await asyncio.sleep(0.01)
            await asyncio.gather(*app[RELOADER]._tasks, return_exceptions=True)
        assert app[GENERATIONS].current is first and closed == ["e"]
        assert await answer(c) == "from a"
        assert "config reload cancelled, configuration 1 stays in force: Velo is stopping" in caplog.text
        assert value(await scrape(c), "velo_config_reloads_total", outcome="cancelled") == 1


async def test_a_reload_refused_while_other_backends_start_leaves_none_of_them_running(tmp_path, two_fakes,
                                                                                      monkeypatch):
    """One new backend failing its start refused the reload while the others' starts ran on past its close: a
    replica set still probing its replicas then started its health prober, which probed them for good."""
    async def fails(self: OpenAIBackend) -> None:
        if self.name == "bad":
            raise BackendError("it cannot start")

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads the probe's request and never answers it
        writer.close()
    a, b = two_fakes
    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    quiet = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server, routed_to_a(tmp_path, a, b) as (c, path):
        app = c.server.app
        first = app[GENERATIONS].current
        monkeypatch.setattr(OpenAIBackend, "start", fails)
        path.write_text(toml(a.url, b.url, "a") + f'[[backends]]\nname = "r"\nkind = "openai"\n'
                        f'urls = ["{quiet}", "{quiet}"]\noptions = {{ health_interval_s = 0.3 }}\n'
                        '[[backends]]\nname = "bad"\nkind = "openai"\nurl = "http://h:1"\n')
        assert not await app[RELOADER].reload()
        assert app[RELOADER].last_error == "it cannot start"
        await asyncio.sleep(0.5)  # past the probe's timeout
        probers = [task for task in asyncio.all_tasks() if task.get_name() == "health:r"]
        for task in probers:
            task.cancel()
        assert not probers and app[GENERATIONS].current is first
        assert await answer(c) == "from a"


async def test_keys_limits_and_cache_settings_change_live_and_the_cache_survives_other_edits(tmp_path, two_fakes):
    a, b = two_fakes
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a"))
    async with await reloaded_app(path) as c:
        app = c.server.app
        await answer(c)
        a.script.reply = "changed"
        path.write_text(toml(a.url, b.url, "a", extra='default_backend = "a"'))  # the cache settings did not change
        assert await app[RELOADER].reload()
        assert await answer(c) == "from a"  # a cache hit: the layer (and its entries) was kept
        path.write_text(toml(a.url, b.url, "a", extra='[server]\napi_keys = ["k"]\n[cache]\nenabled = false'))
        assert await app[RELOADER].reload()
        assert (await c.post("/api/chat", json=CHAT)).status == 401
        assert await answer(c, Authorization="Bearer k") == "changed"  # no cache any more


async def test_long_request_s_changes_live_and_header_timeout_s_says_it_waits_for_a_restart(tmp_path, two_fakes,
                                                                                            caplog):
    """Both changes were ignored without a word: the list of requests outlives a reload, and kept its first
    threshold; the header timeout is the server's, set when it starts."""
    caplog.set_level(logging.WARNING)
    a, b = two_fakes
    a.script.reply, a.script.token_delay = "word " * 20, 0.03  # 0.6 s
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a", extra="[server]\nlong_request_s = 0"))
    async with await reloaded_app(path) as c:
        path.write_text(toml(a.url, b.url, "a", extra="[server]\nlong_request_s = 0.2\nheader_timeout_s = 5"))
        assert await c.server.app[RELOADER].reload()
        await answer(c, {**CHAT, "options": {"temperature": 0.5}})
        said = [r.getMessage() for r in caplog.records]
        assert sum("has run" in m for m in said) == 1
        assert any(m.startswith("server.header_timeout_s changed (15.0 -> 5.0)") for m in said)
        path.write_text(toml(a.url, b.url, "a", extra="[server]\nlong_request_s = 0"))
        assert await c.server.app[RELOADER].reload()
        await answer(c, {**CHAT, "options": {"temperature": 0.6}})
        assert sum("has run" in r.getMessage() for r in caplog.records) == 1  # off again


async def test_an_unchanged_engine_keeps_its_loaded_model_and_a_changed_one_reloads(tmp_path, two_fakes):
    model_dir = write_tiny_model(str(tmp_path / "tiny"), "qwen2")
    engine = f"""
[[backends]]
name = "engine"
kind = "engine"
options = {{ model = "{model_dir}", name = "tiny", progress = false, block_size = 4, kv_memory = 8388608 %s }}
"""
    path = tmp_path / "config.toml"
    path.write_text(engine % "")
    async with await reloaded_app(path) as c:
        app = c.server.app
        before = app[GENERATIONS].current.backends["engine"]
        loaded = before.engine
        assert loaded is not None
        path.write_text('[aliases]\nsmall = "engine:tiny"\n' + engine % "")
        assert await app[RELOADER].reload()
        kept = app[GENERATIONS].current.backends["engine"]
        assert kept is before and kept.engine is loaded
        path.write_text(engine % ", max_num_seqs = 2")
        assert await app[RELOADER].reload()
        await asyncio.wait_for(asyncio.gather(*app[GENERATIONS].retiring), 10)
        changed = app[GENERATIONS].current.backends["engine"]
        assert changed is not before and changed.engine is not None and before.engine is None
        resp = await c.post("/api/generate", json={"model": "tiny", "prompt": "x", "stream": False,
                                                   "options": {"num_predict": 2}})
        assert resp.status == 200


async def test_a_request_from_the_old_configuration_stays_listed_and_cancellable(tmp_path, two_fakes):
    """One list of requests in flight for every configuration: a reload never hides a runaway request from
    `GET /velo/requests`, nor from an admin's cancel."""
    a, b = two_fakes
    a.script.reply, a.script.token_delay = " ".join(["w"] * 200), 0.05
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a"))
    async with await reloaded_app(path) as c:
        app = c.server.app
        resp = await c.post("/api/chat", json={**CHAT, "stream": True})
        await resp.content.readline()
        path.write_text(toml(a.url, b.url, "b"))
        assert await app[RELOADER].reload()
        listed = (await (await c.get("/velo/requests")).json())["requests"]
        assert [r["id"] for r in listed] == [resp.headers["X-Velo-Request-Id"]]
        assert (await c.delete(f"/velo/requests/{listed[0]['id']}")).status == 200
        tail = (await asyncio.wait_for(resp.read(), 5)).decode().strip().splitlines()[-1]
        assert "cancelled by an administrator" in tail
        await asyncio.wait_for(asyncio.gather(*app[GENERATIONS].retiring), 5)
        assert app[GENERATIONS].current.pipeline.inflight.running == {}


async def test_a_restart_only_change_is_logged_without_the_passwords_in_its_urls(tmp_path, two_fakes, caplog):
    """The [responses] section was logged whole, its redis_url's password in it."""
    caplog.set_level(logging.WARNING)
    a, b = two_fakes
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a"))
    async with await reloaded_app(path) as c:
        path.write_text(toml(a.url, b.url, "a", extra='[responses]\nredis_url = "redis://velo:s3cret@db:6379/0"'))
        assert await c.server.app[RELOADER].reload()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("responses changed")]
    assert said and "redis://velo:***@db:6379/0" in said[0] and "s3cret" not in said[0]


async def test_a_backend_whose_settings_change_keeps_its_queue_and_slots(tmp_path, two_fakes):
    """Any change to a backend's settings (here `first_token_timeout`) gave it a new queue beside the old one: for
    the switch, the server got the old queue's requests and the new one's at once (8 streams on a 4-slot server)."""
    a, b = two_fakes
    a.script.reply, a.script.token_delay = "one two three four", 0.3
    path = tmp_path / "config.toml"

    def config(timeout: int) -> str:
        return toml(a.url, b.url, "a").replace(f'url = "{a.url}"\n', f'url = "{a.url}"\nmax_concurrency = 1\n'
                                                                      f"first_token_timeout = {timeout}\n")
    path.write_text(config(300))
    async with await reloaded_app(path) as c:
        first = asyncio.create_task(streamed(c))
        while not any(r.path == "/v1/chat/completions" for r in a.requests):
            await asyncio.sleep(0.01)
        path.write_text(config(200))
        assert await c.server.app[RELOADER].reload()
        second = asyncio.create_task(streamed(c))
        await asyncio.sleep(0.5)
        assert sum(r.path == "/v1/chat/completions" for r in a.requests) == 1  # the second waits for the one slot
        assert await asyncio.gather(first, second) == ["one two three four"] * 2


async def test_a_burst_of_signals_is_one_reload_and_a_signal_during_one_is_another(tmp_path, two_fakes):
    a, b = two_fakes
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a"))
    async with await reloaded_app(path) as c:
        reloader = c.server.app[RELOADER]
        for _ in range(5):
            reloader.trigger()
        while reloader._tasks:
            await asyncio.sleep(0.01)
        assert reloader.applied == 1 and c.server.app[GENERATIONS].current.number == 2
        async with reloader._lock:  # a reload is reading the file: a signal now asks for the next one
            reloader.trigger()
            reloader.trigger()
        while reloader._tasks:
            await asyncio.sleep(0.01)
        assert reloader.applied == 2


async def test_a_limits_change_keeps_what_each_key_used_and_its_requests_running(tmp_path, two_fakes):
    a, b = two_fakes
    a.script.token_delay = 0.2
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a", extra="[limits]\nconcurrency = 1\nrequests_per_minute = 1\n"
                                                  "request_burst = 2"))
    async with await reloaded_app(path) as c:
        app = c.server.app
        streaming = asyncio.create_task(streamed(c))
        while not any(r.path == "/v1/chat/completions" for r in a.requests):
            await asyncio.sleep(0.01)
        path.write_text(toml(a.url, b.url, "a", extra="[limits]\nconcurrency = 1\nrequests_per_minute = 1\n"
                                                      "request_burst = 3"))
        assert await app[RELOADER].reload()
        busy = await c.post("/api/chat", json=CHAT)
        assert busy.status == 429 and "this key has 1 request running (limit 1)" in (await busy.json())["error"]
        await streaming
        assert await answer(c) == "from a"  # the second of the new burst of 3 (the refused one took none)
        assert await answer(c) == "from a"
        over = await c.post("/api/chat", json=CHAT)
        assert over.status == 429 and "request limit" in (await over.json())["error"]


async def test_a_port_from_the_command_line_is_no_change_of_the_file(tmp_path, two_fakes, caplog):
    """`velo serve --port` overrides the file's: each reload warned that server.port changed."""
    a, b = two_fakes
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a", extra="[server]\nport = 8000"))
    config = load_config(path)
    config.server.port = 18310  # as `velo serve --port 18310` sets it
    async with TestClient(TestServer(make_app(config, config_path=path))) as c:
        with caplog.at_level(logging.WARNING, logger="velo.reload"):
            for _ in range(2):
                assert await c.server.app[RELOADER].reload()
            assert "changed" not in caplog.text
            assert c.server.app[GENERATIONS].current.config.server.port == 18310
            path.write_text(toml(a.url, b.url, "a", extra="[server]\nport = 9000"))
            for _ in range(2):
                assert await c.server.app[RELOADER].reload()
        assert caplog.text.count("server.port changed (8000 -> 9000)") == 1


async def test_a_file_that_names_no_backend_keeps_the_default_through_its_edits(tmp_path, two_fakes):
    a, _ = two_fakes
    path = tmp_path / "config.toml"
    path.write_text("[server]\nlong_request_s = 0\n")
    config = load_config(path)
    config.backends = [BackendConfig(name="a", kind="openai", urls=[a.url])]
    config.default_backend = "a"  # as velo serve fills it in (proxy/cli.py default_config)
    async with TestClient(TestServer(make_app(config, config_path=path))) as c:
        path.write_text("[server]\nlong_request_s = 5\n")
        assert await c.server.app[RELOADER].reload()
        current = c.server.app[GENERATIONS].current.config
        assert current.server.long_request_s == 5 and [b.name for b in current.backends] == ["a"]
        assert await answer(c, {**CHAT, "model": "fake-gpt"}) == "from a"


async def test_an_edit_that_drops_every_backend_is_served_by_the_default_as_a_start_with_it_is(tmp_path, two_fakes,
                                                                                                monkeypatch):
    """A file edited to name no backend is what `velo serve` starts on the default backend with: the reload built a
    configuration of no backends, every model a 404, until a restart."""
    async def ollama_answers(*_: object) -> bool:
        return True
    monkeypatch.setattr("proxy.default_backend.ollama_running", ollama_answers)
    a, b = two_fakes
    async with routed_to_a(tmp_path, a, b) as (c, path):
        path.write_text("[server]\nlong_request_s = 5\n")
        assert await c.server.app[RELOADER].reload()
        current = c.server.app[GENERATIONS].current.config
        assert [(b.name, b.kind) for b in current.backends] == [("ollama", "ollama")]
        assert current.default_backend == "ollama"


async def test_the_cache_counters_outlive_a_change_of_its_settings(tmp_path, two_fakes):
    a, b = two_fakes
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a"))
    async with await reloaded_app(path) as c:
        await answer(c)
        await answer(c)
        assert value(await scrape(c), "velo_cache_events_total", tier="all", model="m", outcome="hit") == 1
        path.write_text(toml(a.url, b.url, "a", extra="[cache]\nttl_s = 60"))
        assert await c.server.app[RELOADER].reload()
        await answer(c)  # a new layer: its entries are gone, its counts are not
        scraped = await scrape(c)
        assert value(scraped, "velo_cache_events_total", tier="all", model="m", outcome="hit") == 1
        assert value(scraped, "velo_cache_events_total", tier="all", model="m", outcome="miss") == 2


async def test_a_config_refused_when_its_cache_does_not_open_leaves_the_limits_in_force(tmp_path, two_fakes):
    """The limit stage started before the cache, and put the refused file's limits on the keys: a request limit of
    1 a minute answered 429 to a key the configuration in force allows 100."""
    a, b = two_fakes
    path = tmp_path / "config.toml"
    path.write_text(toml(a.url, b.url, "a", extra="[limits]\nrequests_per_minute = 100\nrequest_burst = 100"))
    async with await reloaded_app(path) as c:
        app = c.server.app
        refused = ('[server]\nlong_request_s = 7\n[limits]\nrequests_per_minute = 1\n'
                   f'[cache]\nsqlite_path = "{tmp_path}"')
        path.write_text(toml(a.url, b.url, "a", extra=refused))
        assert not await app[RELOADER].reload()
        assert "Is a directory" in app[RELOADER].last_error
        for temperature in (0.1, 0.2, 0.3):
            assert await answer(c, {**CHAT, "options": {"temperature": temperature}}) == "from a"
        assert app[GENERATIONS].current.pipeline.inflight.long_request_s == 300


async def test_the_coalescing_and_embedding_counters_outlive_a_reload(tmp_path, two_fakes):
    """Each configuration counted in counters of its own: every reload set velo_coalesced_total (the dashboard's
    "coalesced") and velo_embed_backend_calls_total back to 0, and what the old configuration's requests still
    did after the swap was never shown."""
    a, b = two_fakes
    a.script.token_delay = 0.2
    async with routed_to_a(tmp_path, a, b) as (c, path):
        await asyncio.gather(answer(c), answer(c))
        assert (await c.post("/api/embed", json={"model": "m", "input": "x"})).status == 200
        path.write_text(toml(a.url, b.url, "b"))
        assert await c.server.app[RELOADER].reload()
        scraped = await scrape(c)
        assert value(scraped, "velo_coalesced_total") == 1
        assert value(scraped, "velo_embed_backend_calls_total", backend="a") == 1
