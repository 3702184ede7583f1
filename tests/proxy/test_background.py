"""Background responses (`background: true`) with the official `openai` package: the request returns at once and
the answer goes on without it; polled, followed again from any event after a dropped stream, cancelled, listed as a
request in flight."""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

import openai
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from adapters.protocol import ToolCall
from proxy.app import make_app
from proxy.batching.config import BatchingConfig
from proxy.cache.config import CacheConfig
from proxy.cache.redis_store import RedisStore
from proxy.config import Config, ServerConfig
from proxy.limits import LimitsConfig
from proxy.inflight import Cancelled, ShuttingDown
from proxy.responses_store import ResponsesConfig
from proxy.stages.admit import Admit
from proxy.state import BACKGROUND, GENERATIONS, RESPONSES
from tests.fakes import FakeOpenAI, FakeServer, OllamaDouble
from tests.proxy.batching.test_http import Stuck
from tests.proxy.test_metrics import samples
from tests.proxy.test_responses_dialect import sse_events
from tests.scripted import Script, ScriptedBackend

KEY = {"Authorization": "Bearer sk-test"}  # the SDK's: a response is its caller's


def _client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)


async def _until(sdk: openai.AsyncOpenAI, resp_id: str, *statuses: str):
    for _ in range(500):
        found = await sdk.responses.retrieve(resp_id)
        if found.status in statuses:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"{resp_id} never reached {statuses}: {found.status}")


async def test_a_background_response_returns_queued_and_is_polled_to_its_answer(base_url, scripted: ScriptedBackend):
    """It returned only once the whole answer was written, so a client's request timeout still cut a long one."""
    scripted.script.pieces, scripted.script.delay = ["a"] * 40, 0.05
    sdk = _client(base_url)
    queued = await sdk.responses.create(model="tiny", input="hi", background=True)
    assert (queued.status, queued.output, queued.background, queued.usage) == ("queued", [], True, None)
    assert (await sdk.responses.retrieve(queued.id)).status in ("queued", "in_progress")
    done = await _until(sdk, queued.id, "completed")
    assert done.output_text == "a" * 40 and done.usage.output_tokens == 40
    with pytest.raises(openai.BadRequestError) as e:  # as OpenAI: "Cannot cancel a completed response."
        await sdk.responses.cancel(queued.id)
    assert "completed" in e.value.message
    unstored = await sdk.responses.create(model="tiny", input="hi", background=True, store=False)
    assert (await _until(sdk, unstored.id, "completed")).output_text == "a" * 40  # kept for polling


async def test_cancelling_ends_the_backends_work_and_keeps_what_was_written(base_url, scripted: ScriptedBackend):
    scripted.script.pieces, scripted.script.delay = ["a"] * 200, 0.02
    sdk = _client(base_url)
    running = await sdk.responses.create(model="tiny", input="hi", background=True)
    await _until(sdk, running.id, "in_progress")
    cancelled = await sdk.responses.cancel(running.id)
    assert (cancelled.id, cancelled.status) == (running.id, "cancelled")
    assert scripted.cancelled == 1 and scripted.completed == 0
    assert (await sdk.responses.retrieve(running.id)).status == "cancelled"
    assert (await sdk.responses.cancel(running.id)).status == "cancelled"  # again: as it is
    plain = await sdk.responses.create(model="tiny", input="hi", max_output_tokens=16)
    with pytest.raises(openai.BadRequestError):
        await sdk.responses.cancel(plain.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.cancel("resp_missing")


@pytest.mark.parametrize("kind", ["openai", "ollama"])
async def test_a_polled_response_is_in_progress_and_keeps_its_output_so_far_when_cancelled(kind: str):
    """A background response created without `stream` was asked of the backend as one answer, folded whole at its
    end: polled, it stayed `queued` all the while the backend wrote it, and a cancel kept none of its output (the
    scripted backend, which streams whatever it is asked, hid it)."""
    up: FakeServer = FakeOpenAI(models=["m"]) if kind == "openai" else OllamaDouble(models=["m"])
    async with up:
        up.script.reply, up.script.token_delay = " ".join(["word"] * 200), 0.01
        cfg = Config(backends=[BackendConfig(name="up", kind=kind, urls=[up.url])], default_backend="up",
                     cache=CacheConfig(enabled=False))
        async with TestClient(TestServer(make_app(cfg))) as c:
            sdk = _client(str(c.make_url("")).rstrip("/"))
            running = await sdk.responses.create(model="m", input="hi", background=True)
            await _until(sdk, running.id, "in_progress")
            await asyncio.sleep(0.3)  # a few words written, of the 200 that take 2 s
            cancelled = await sdk.responses.cancel(running.id)
            assert cancelled.status == "cancelled" and cancelled.output[0].status == "incomplete"
            assert cancelled.output_text.startswith("word word") and len(cancelled.output_text) < len(up.script.reply)
            assert (await sdk.responses.retrieve(running.id)).output_text == cancelled.output_text


@pytest.mark.parametrize("kind", ["openai", "ollama"])
async def test_a_background_response_for_a_model_the_backend_does_not_have_is_a_404_before_queued(kind: str):
    """Answered 200 `queued`, its run then failing on the backend's 404, though that 404 is the one a request
    without `background` gets at once: where the backend's own lookup knows it (Ollama's /api/show), the 404 comes
    before `queued`, streamed or not. An OpenAI-compatible server may serve names it does not list: Velo learns of
    it only from the run, which fails with the model's error."""
    up: FakeServer = FakeOpenAI(models=["m"]) if kind == "openai" else OllamaDouble(models=["m"])
    async with up:
        cfg = Config(backends=[BackendConfig(name="up", kind=kind, urls=[up.url])], default_backend="up",
                     cache=CacheConfig(enabled=False))
        async with TestClient(TestServer(make_app(cfg))) as c:
            sdk = _client(str(c.make_url("")).rstrip("/"))
            with pytest.raises(openai.NotFoundError) as at_once:
                await sdk.responses.create(model="nope", input="hi")
            assert at_once.value.code == "model_not_found"
            for stream in (False, True):
                if kind == "openai":
                    queued = await sdk.responses.create(model="nope", input="hi", background=True)
                    failed = await _until(sdk, queued.id, "failed")
                    assert failed.error.message == "model 'nope' not found"
                    break
                with pytest.raises(openai.NotFoundError) as e:  # before: 200 `queued`, then `failed`
                    await sdk.responses.create(model="nope", input="hi", background=True, stream=stream)
                assert (e.value.status_code, e.value.body) == (404, at_once.value.body)


async def test_a_dropped_stream_goes_on_and_is_followed_again_from_where_it_broke(client, base_url,
                                                                                  scripted: ScriptedBackend):
    """Dropping a background stream cancelled the answer, and the response was never stored: the resume that
    background mode is for found nothing. The events followed again are the very ones the first stream would
    have sent, numbers included, live and once stored."""
    scripted.script.thinking = "Think."
    scripted.script.tool_calls = [ToolCall("exec_command", {"cmd": "ls"}, "call_1")]
    scripted.script.pieces, scripted.script.delay = [f"w{i} " for i in range(20)], 0.03
    body = {"model": "tiny", "input": "hi", "stream": True, "background": True, "tools": [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {
            "cmd": {"type": "string"}}}}]}
    first = await client.post("/v1/responses", headers=KEY, json=body)
    seen = b""
    while seen.count(b"\n\n") < 8:
        seen += await first.content.readany()
    first.close()  # the client leaves
    head = sse_events(seen.decode()[:seen.decode().rindex("\n\n") + 2])
    resp_id, last = head[0][1]["response"]["id"], head[-1][1]["sequence_number"]
    again = await client.get(f"/v1/responses/{resp_id}", headers=KEY,
                             params={"stream": "true", "starting_after": str(last)})
    rest = sse_events(await again.text())
    assert [d["sequence_number"] for _, d in head + rest] == list(range(len(head) + len(rest)))
    final = rest[-1][1]["response"]
    assert rest[-1][0] == "response.completed" and final["status"] == "completed"
    assert "".join(d["delta"] for e, d in head + rest if e == "response.output_text.delta") == \
        "".join(scripted.script.pieces)

    stored = await client.get(f"/v1/responses/{resp_id}", headers=KEY, params={"stream": "true"})
    assert stored.content_type == "text/event-stream" and sse_events(await stored.text()) == head + rest
    sdk = _client(base_url)
    async with sdk.responses.stream(response_id=resp_id) as stream:
        names = [e.type async for e in stream]
        whole = await stream.get_final_response()
    assert names == [n for n, _ in head + rest] and whole.output_text == "".join(scripted.script.pieces)
    tail = [e async for e in await sdk.responses.retrieve(resp_id, stream=True, starting_after=5)]
    assert [e.sequence_number for e in tail] == list(range(6, len(head) + len(rest)))

    for wrong in ({"stream": "yes"}, {"stream": "true", "starting_after": str(len(head) + len(rest))},
                  {"stream": "true", "starting_after": "x"}):
        bad = await client.get(f"/v1/responses/{resp_id}", headers=KEY, params=wrong)
        assert bad.status == 400 and (await bad.json())["error"]["param"] == next(reversed(wrong))
    plain = await sdk.responses.create(model="tiny", input="hi")
    with pytest.raises(openai.BadRequestError) as e:  # OpenAI streams only background responses
        await sdk.responses.retrieve(plain.id, stream=True)
    assert "background" in e.value.message


async def test_a_background_response_is_a_request_in_flight_an_admin_can_end(client, base_url,
                                                                             scripted: ScriptedBackend):
    scripted.script.pieces, scripted.script.delay = ["a"] * 200, 0.02
    sdk = _client(base_url)
    running = await sdk.responses.create(model="tiny", input="hi", background=True)
    await _until(sdk, running.id, "in_progress")
    listed = (await (await client.get("/velo/requests")).json())["requests"]
    assert [(r["id"], r["path"], r["models"]) for r in listed] == [(running.id, "/v1/responses", ["tiny"])]
    assert (await client.delete(f"/velo/requests/{running.id}")).status == 200
    assert (await _until(sdk, running.id, "cancelled")).status == "cancelled"
    assert scripted.cancelled == 1


@pytest.mark.parametrize("config", [Config(server=ServerConfig(api_keys=["sk-test", "sk-other"]))])
async def test_a_background_response_is_listed_and_ended_by_its_own_key_alone(client, base_url,
                                                                              scripted: ScriptedBackend):
    """Where keys are set and no admin_keys, any key listed, and ended, every key's requests in flight, background
    responses among them: no request sees another key's data."""
    scripted.script.pieces, scripted.script.delay = ["a"] * 200, 0.02
    sdk = _client(base_url)
    running = await sdk.responses.create(model="tiny", input="hi", background=True)
    await _until(sdk, running.id, "in_progress")
    other = {"Authorization": "Bearer sk-other"}
    assert [r["id"] for r in (await (await client.get("/velo/requests", headers=KEY)).json())["requests"]] == \
        [running.id]
    assert (await (await client.get("/velo/requests", headers=other)).json())["requests"] == []
    assert (await client.delete(f"/velo/requests/{running.id}", headers=other)).status == 404
    assert (await client.delete(f"/velo/requests/{running.id}", headers=KEY)).status == 200
    assert (await _until(sdk, running.id, "cancelled")).status == "cancelled"


async def test_a_response_still_written_when_velo_stops_is_stored_as_cancelled(tmp_path):
    """Closing the app ends the work and keeps what was written: after a restart, the response is there, with its
    events, rather than queued for ever or gone."""
    cfg = Config(responses=ResponsesConfig(sqlite_path=str(tmp_path / "responses.db")))
    slow = ScriptedBackend("s", script=Script(pieces=["a"] * 500, delay=0.02))
    async with TestClient(TestServer(make_app(cfg, {"s": slow}))) as c:
        made = await (await c.post("/v1/responses", json={"model": "tiny", "input": "hi", "background": True})).json()
        while slow.requests == []:
            await asyncio.sleep(0.01)
    assert slow.cancelled == 1
    async with TestClient(TestServer(make_app(cfg, {"s": ScriptedBackend("s")}))) as c:  # a restart
        found = await (await c.get(f"/v1/responses/{made['id']}")).json()
        events = sse_events(await (await c.get(f"/v1/responses/{made['id']}", params={"stream": "true"})).text())
    assert found["status"] == "cancelled" and found["background"] is True
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))


async def test_a_background_response_is_counted_once_by_its_model(client, base_url):
    """The request that starts it was counted too, under its route and no model: two requests for one."""
    sdk = _client(base_url)
    made = await sdk.responses.create(model="tiny", input="hi", background=True)
    await _until(sdk, made.id, "completed")
    found = samples(await (await client.get("/metrics")).text())
    counted = {labels: n for (name, labels), n in found.items() if name == "velo_requests_total"
               and ("endpoint", "/v1/responses") in labels}
    assert list(counted.values()) == [1.0] and ("model", "tiny") in next(iter(counted))


async def test_a_cancel_while_the_answer_is_stored_does_not_cut_the_store(tmp_path):
    """A cancel (the client's, an admin's, a shutdown's) that came while the finished answer was written to SQLite cut
    that write: after a restart the response was 404, though its client had been told it completed."""
    cfg = Config(responses=ResponsesConfig(sqlite_path=str(tmp_path / "responses.db")))
    app = make_app(cfg, {"s": ScriptedBackend("s")})
    async with TestClient(TestServer(app)) as c:
        made = await (await c.post("/v1/responses", headers=KEY, json={"model": "tiny", "input": "hi",
                                                                     "background": True})).json()
        (tenant, _), run = next(iter(app[BACKGROUND].runs.items()))
        for _ in range(10000):  # in memory first, then on its way to SQLite
            if app[RESPONSES].memory.get(f"{tenant}:{made['id']}") is not None:
                break
            await asyncio.sleep(0)
        assert not run.done
        app[GENERATIONS].current.pipeline.inflight.cancel(made["id"], Cancelled("cancelled by its client"))
        await asyncio.wait([run.task], timeout=5)
        assert (await (await c.get(f"/v1/responses/{made['id']}", headers=KEY)).json())["status"] == "completed"
    async with TestClient(TestServer(make_app(cfg, {"s": ScriptedBackend("s")}))) as c:  # a restart
        found = await c.get(f"/v1/responses/{made['id']}", headers=KEY)
        assert found.status == 200 and (await found.json())["status"] == "completed"


async def test_a_store_that_fails_is_logged_and_the_answer_still_polled(client, base_url, scripted: ScriptedBackend,
                                                                        caplog):
    """With its Redis down, the store's error was left in the task no one awaits: asyncio's 'Task exception was never
    retrieved', and nothing of Velo's own in the log."""
    app, scripted.script.silence = client.server.app, 0.5  # still running when the POST is answered
    down = RedisStore(aioredis.from_url("redis://127.0.0.1:1/0"), prefix="velo:responses:")
    app[RESPONSES].tiers.append(down)
    sdk = _client(base_url)
    made = await sdk.responses.create(model="tiny", input="hi", background=True)
    task = next(iter(app[BACKGROUND].runs.values())).task
    await asyncio.wait([task], timeout=5)
    assert task.done() and task.exception() is None
    assert "stored responses: redis failed on put" in caplog.text
    assert (await _until(sdk, made.id, "completed")).output_text == "Hello world"  # from this process's memory
    app[RESPONSES].tiers.remove(down)
    await down.close()


async def test_a_response_ended_by_a_shutdown_fails_in_its_stream_too(client, base_url, scripted: ScriptedBackend):
    """Stored as failed, with the shutdown's error, its events ended with no `response.failed`: a client following
    it again after the restart read an answer cut short, and the SDK's stream helper ended with no error (its
    `get_final_response()` then raised "Didn't receive a `response.completed` event")."""
    scripted.script.pieces, scripted.script.delay = ["a"] * 200, 0.02
    sdk = _client(base_url)
    running = await sdk.responses.create(model="tiny", input="hi", background=True)
    await _until(sdk, running.id, "in_progress")
    client.server.app[GENERATIONS].current.pipeline.inflight.cancel_all(ShuttingDown("Velo is shutting down"))
    failed = await _until(sdk, running.id, "failed")
    assert failed.error.message == "Velo is shutting down" and scripted.cancelled == 1
    with pytest.raises(openai.APIError, match="Velo is shutting down"):
        async with sdk.responses.stream(response_id=running.id) as stream:
            async for _ in stream:
                pass
    events = sse_events(await (await client.get(f"/v1/responses/{running.id}", headers=KEY,
                                                params={"stream": "true"})).text())
    assert [e for e, _ in events[-2:]] == ["error", "response.failed"]
    assert events[-1][1]["response"]["error"]["message"] == "Velo is shutting down"


async def test_a_response_polled_completed_is_found_by_the_next_turn(base_url, scripted: ScriptedBackend):
    """GET said completed as soon as the answer's last chunk came, before the pipeline's work after it and the store:
    the next turn, sent at once with `previous_response_id`, was a 400 "Previous response ... not found"."""
    scripted.script.after_finish = 0.5  # a stage's work after the answer
    sdk = _client(base_url)
    made = await sdk.responses.create(model="tiny", input="hi", background=True)
    polled = await _until(sdk, made.id, "completed", "failed", "cancelled")
    assert polled.status == "completed"
    nxt = await sdk.responses.create(model="tiny", input="and?", previous_response_id=made.id)
    assert nxt.status == "completed"


async def test_a_cancel_after_the_answer_ended_keeps_it_completed(client, base_url, scripted: ScriptedBackend):
    """A cancel during the pipeline's work after the answer stored it as cancelled, while its events, stored with it
    and already written, ended with `response.completed`: the stream and GET disagreed."""
    scripted.script.after_finish = 5.0  # a stage's work after the answer
    sdk = _client(base_url)
    made = await sdk.responses.create(model="tiny", input="hi", background=True)
    run = next(iter(client.server.app[BACKGROUND].runs.values()))
    for _ in range(500):
        if run.writer.final is not None:
            break
        await asyncio.sleep(0.01)
    assert (await sdk.responses.cancel(made.id)).status == "completed"
    found = await sdk.responses.retrieve(made.id)
    events = [e async for e in await sdk.responses.retrieve(made.id, stream=True)]
    assert (found.status, found.output_text) == ("completed", "Hello world")
    assert (events[-1].type, events[-1].response.status) == ("response.completed", "completed")


async def test_a_failure_after_the_answer_ended_keeps_it_completed(base_url, scripted: ScriptedBackend):
    """A backend failing after its answer's last chunk (the pipeline's work after it) ended a foreground stream with
    its `response.completed`; a background one went on past it with `error` and `response.failed`, and was stored
    failed with the whole answer written."""
    scripted.script.after_finish, scripted.script.fail_after_finish = 0.1, True
    sdk = _client(base_url)
    made = await sdk.responses.create(model="tiny", input="hi", background=True)
    found = await _until(sdk, made.id, "completed", "failed")
    events = [e async for e in await sdk.responses.retrieve(made.id, stream=True)]
    assert (found.status, found.output_text) == ("completed", "Hello world")
    assert events[-1].type == "response.completed" and "response.failed" not in [e.type for e in events]


async def test_a_background_response_with_store_false_is_kept_for_polling_only(client, base_url):
    """Kept 10 minutes for polling, it was continued by `previous_response_id` and its items named by
    `item_reference`, as a stored response is, though its client had asked that nothing be stored."""
    sdk = _client(base_url)
    made = await sdk.responses.create(model="tiny", input="hi", background=True, store=False)
    done = await _until(sdk, made.id, "completed")
    assert (done.output_text, done.store) == ("Hello world", False)
    with pytest.raises(openai.BadRequestError) as e:
        await sdk.responses.create(model="tiny", input="and?", previous_response_id=made.id)
    assert e.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.create(model="tiny", input=[{"type": "item_reference", "id": done.output[0].id}])
    assert (await sdk.responses.retrieve(made.id)).status == "completed"


async def test_a_streamed_background_response_names_itself_before_its_first_token(client, base_url,
                                                                                 scripted: ScriptedBackend):
    """Its stream sent nothing, headers included, until the backend's first chunk (or the heartbeat, 15 s by
    default): a client that left before then, while a long prompt was read, never learnt the id it could follow
    again or cancel."""
    scripted.script.silence = 30.0  # a backend still reading the prompt
    resp = await asyncio.wait_for(client.post("/v1/responses", headers=KEY, json={
        "model": "tiny", "input": "hi", "background": True, "stream": True}), 5)
    head = b""
    while head.count(b"\n\n") < 1:
        head += await asyncio.wait_for(resp.content.readany(), 5)
    resp.close()
    name, first = sse_events(head.decode()[:head.decode().index("\n\n") + 2])[0]
    assert (name, first["sequence_number"]) == ("response.created", 0)
    sdk = _client(base_url)
    assert (await sdk.responses.cancel(first["response"]["id"])).status == "cancelled"
    assert scripted.cancelled == 1


async def test_a_key_over_its_limits_is_refused_by_the_request_that_would_start_it():
    """The limits applied inside the background task: the request answered `queued` and the response then failed
    with rate_limit_exceeded, where OpenAI answers the request itself with a 429 and Retry-After (SDKs wait it out
    and retry)."""
    cfg = Config(limits=LimitsConfig(requests_per_minute=1, request_burst=1))
    backend = ScriptedBackend("s")
    async with TestClient(TestServer(make_app(cfg, {"s": backend}))) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        first = await sdk.responses.create(model="tiny", input="hi", background=True)
        assert (await _until(sdk, first.id, "completed")).output_text == "Hello world"
        for stream in (False, True):
            with pytest.raises(openai.RateLimitError) as e:
                await sdk.responses.create(model="tiny", input="hi", background=True, stream=stream)
            assert int(e.value.response.headers["Retry-After"]) > 0
    assert len(backend.requests) == 1


async def test_a_full_queue_is_refused_by_the_request_that_would_start_it():
    """`[batching] max_queue` promises a 429 with Retry-After beyond it: the request answered `queued` and the
    response then failed with rate_limit_exceeded, which no SDK retries, so the work was lost."""
    backend = ScriptedBackend("s", script=Script(pieces=["a"] * 50, delay=0.02))
    backend.config.max_concurrency = 1
    app = make_app(Config(batching=BatchingConfig(max_queue=1)), {"s": backend})
    async with TestClient(TestServer(app)) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        made = [await sdk.responses.create(model="tiny", input="hi", background=True) for _ in range(2)]
        queue = app[GENERATIONS].current.pipeline.stage(Admit).controllers["s"]
        while queue.queued < 1:  # one runs, one waits: the queue is full
            await asyncio.sleep(0.01)
        for stream in (False, True):
            with pytest.raises(openai.RateLimitError) as e:
                await sdk.responses.create(model="tiny", input="hi", background=True, stream=stream)
            assert int(e.value.response.headers["Retry-After"]) > 0 and "queue is full" in e.value.message
        assert [(await _until(sdk, m.id, "completed", "failed")).status for m in made] == ["completed"] * 2


async def test_a_burst_is_refused_beyond_what_the_queue_holds():
    """Each request of a burst found the queue empty, its task not yet in it: all six answered `queued`, and four
    then failed with "queue is full", which no SDK retries. A place is taken with the check, so the four get 429s."""
    backend = ScriptedBackend("s", script=Script(pieces=["a"] * 20, delay=0.02))
    backend.config.max_concurrency = 1
    app = make_app(Config(batching=BatchingConfig(max_queue=1), limits=LimitsConfig(concurrency=6)), {"s": backend})
    async with TestClient(TestServer(app)) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        made = await asyncio.gather(*(sdk.responses.create(model="tiny", input=f"hi {i}", background=True)
                                      for i in range(6)), return_exceptions=True)
        refused = [m for m in made if isinstance(m, openai.RateLimitError)]
        assert len(refused) == 4 and all("queue is full" in e.message for e in refused)
        accepted = [m for m in made if not isinstance(m, BaseException)]
        assert [(await _until(sdk, m.id, "completed", "failed")).status for m in accepted] == ["completed"] * 2
        queue = app[GENERATIONS].current.pipeline.stage(Admit).controllers["s"]
        assert (queue.running, queue.queued, queue._reserved) == (0, 0, 0)
        assert app[GENERATIONS].current.pipeline.limit.limits.running() == {}  # the refused gave their shares back


@contextlib.asynccontextmanager
async def _one_slot_taken(batching: BatchingConfig) -> AsyncIterator[tuple[web.Application, Stuck, openai.AsyncOpenAI,
                                                                           asyncio.Task]]:
    """Velo (cache off) over a backend of one slot, which an interactive request ("other", the task given) holds
    until the backend's `go` is set."""
    backend = Stuck()
    backend.config.max_concurrency = 1
    app = make_app(Config(cache=CacheConfig(enabled=False), batching=batching), {backend.name: backend})
    async with TestClient(TestServer(app)) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        held = asyncio.create_task(sdk.responses.create(model="tiny", input="other"))
        await backend.running.wait()
        yield app, backend, sdk, held


async def test_a_response_riding_on_an_identical_ones_call_holds_no_place_in_the_queue():
    """A background response that joined an identical one's call kept the place it took at the edge until it ended:
    a queue of 2 with one call waiting refused a third request, "backend queue is full (2 waiting)"."""
    async with _one_slot_taken(BatchingConfig(max_queue=2)) as (app, backend, sdk, held):
        made = [await sdk.responses.create(model="tiny", input="same", temperature=0, background=True)
                for _ in range(2)]
        queue = app[GENERATIONS].current.pipeline.stage(Admit).controllers[backend.name]
        try:
            while queue.queued < 1:
                await asyncio.sleep(0.01)
            made.append(await sdk.responses.create(model="tiny", input="third", background=True))
        finally:
            backend.go.set()  # the slot frees, whatever the outcome: a failure would wait on it for good
        await held
        assert [(await _until(sdk, m.id, "completed", "failed")).status for m in made] == ["completed"] * 3
    assert [r.messages[-1].content for r in backend.requests] == ["other", "same", "third"]


async def test_a_queued_background_response_waits_past_the_interactive_queue_timeout():
    """Its client polls, and OpenAI keeps one `queued` until it runs: after `queue_timeout_s` (the wait a client on
    its connection is given) it failed with rate_limit_exceeded, which nothing retries. It waits up to its backend's
    `total_timeout`, and then fails, naming that bound."""
    backend = ScriptedBackend("s", script=Script(pieces=["a"] * 20, delay=0.05))
    backend.config.max_concurrency = 1
    app = make_app(Config(batching=BatchingConfig(queue_timeout_s=0.1)), {"s": backend})
    async with TestClient(TestServer(app)) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        made = await asyncio.gather(*(sdk.responses.create(model="tiny", input=f"hi {i}", background=True)
                                      for i in range(2)))
        assert [(await _until(sdk, m.id, "completed", "failed")).status for m in made] == ["completed"] * 2
        backend.config.total_timeout = 0.3
        made = await asyncio.gather(*(sdk.responses.create(model="tiny", input=f"hi {i}", background=True)
                                      for i in range(2)))
        ended = [await _until(sdk, m.id, "completed", "failed") for m in made]
        assert sorted(e.status for e in ended) == ["completed", "failed"]
        error = next(e.error for e in ended if e.status == "failed")
        assert error.code == "rate_limit_exceeded" and "within 0.3 s" in error.message
        assert "total_timeout" in error.message


async def test_a_background_response_never_rides_on_an_interactive_requests_queued_call():
    """Identical and greedy, a background response joined an interactive stream's call waiting in the queue, and
    failed with it after `queue_timeout_s` (rate_limit_exceeded, which nothing retries), where alone it waits up to
    its backend's `total_timeout` and is answered."""
    async with _one_slot_taken(BatchingConfig(queue_timeout_s=0.2)) as (_, backend, sdk, held):
        async def interactive() -> list[str]:
            return [e.type async for e in await sdk.responses.create(model="tiny", input="same", temperature=0,
                                                                     stream=True)]
        waiting = asyncio.create_task(interactive())
        await asyncio.sleep(0.05)
        made = await sdk.responses.create(model="tiny", input="same", temperature=0, background=True)
        with pytest.raises(openai.RateLimitError):  # its own bound
            await waiting
        await asyncio.sleep(0.1)
        backend.go.set()
        await held
        ended = await _until(sdk, made.id, "completed", "failed")
        assert ended.status == "completed", ended.error
    assert [r.messages[-1].content for r in backend.requests] == ["other", "same"]


@pytest.mark.parametrize("limits, why", [(LimitsConfig(requests_per_minute=1, request_burst=1),
                                          "request limit of 1 per minute reached"),
                                         (LimitsConfig(concurrency=1), "1 request running (limit 1)")])
async def test_a_burst_is_refused_beyond_the_keys_limits_by_its_requests(limits: LimitsConfig, why: str):
    """The key's limits were checked at the request and charged in its task: each of a burst found the key's buckets
    as they were before any task had taken from them, so all four answered `queued`, and three then failed with
    rate_limit_exceeded, which no SDK retries. The share is taken with the check, so the three get 429s."""
    backend = ScriptedBackend("s", script=Script(pieces=["a"] * 10, delay=0.02))
    app = make_app(Config(limits=limits), {"s": backend})
    async with TestClient(TestServer(app)) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        made = await asyncio.gather(*(sdk.responses.with_raw_response.create(model="tiny", input=f"hi {i}",
                                                                             background=True)
                                      for i in range(4)), return_exceptions=True)
        refused = [m for m in made if isinstance(m, openai.RateLimitError)]
        assert len(refused) == 3 and all(why in e.message for e in refused)
        assert all(int(e.response.headers["Retry-After"]) > 0 for e in refused)
        accepted = [m for m in made if not isinstance(m, BaseException)]
        assert [m.headers.get("x-ratelimit-limit-requests") for m in accepted] == [
            "1" if limits.requests_per_minute else None]
        done = await _until(sdk, accepted[0].parse().id, "completed", "failed")
        assert (done.status, done.output_text) == ("completed", "a" * 10) and len(backend.requests) == 1
        assert app[GENERATIONS].current.pipeline.limit.limits.running() == {}


async def test_a_background_answer_from_the_cache_or_an_identical_call_is_charged_once():
    """The share a request takes is the one its task is admitted with: each response costs the key one request, and
    only the answer a backend wrote costs tokens (one that rode on an identical response's call, or came from the
    cache, none)."""
    backend = ScriptedBackend("s", script=Script(pieces=["a"] * 10, delay=0.02))
    app = make_app(Config(limits=LimitsConfig(requests_per_minute=4, tokens_per_minute=1000)), {"s": backend})
    async with TestClient(TestServer(app)) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        limits = app[GENERATIONS].current.pipeline.limit.limits
        limits.clock = lambda: 0.0  # no refill while it runs

        async def answered(n: int) -> list:
            made = await asyncio.gather(*(sdk.responses.create(model="tiny", input="hi", temperature=0,
                                                               background=True) for _ in range(n)))
            return [await _until(sdk, m.id, "completed") for m in made]
        together = await answered(2)
        assert len(backend.requests) == 1 and (await answered(1))[0].output_text == "a" * 10
        assert len(backend.requests) == 1 and len({r.usage.total_tokens for r in together}) == 1
        entry, spent = *limits.keys.values(), together[0].usage.total_tokens
        assert (entry.requests.level, entry.tokens.level, entry.running) == (1, 1000 - spent, 0)
        await sdk.responses.create(model="tiny", input="again", background=True)
        with pytest.raises(openai.RateLimitError):
            await sdk.responses.create(model="tiny", input="more", background=True)


@pytest.mark.parametrize("stream", [False, True], ids=["queued", "streamed"])
async def test_a_response_cancelled_at_once_gives_back_its_queue_place_and_its_keys_share(stream: bool):
    """Its request takes a place in its backend's queue and a share of its key's limits for a task that runs later.
    Cancelled as soon as its id is known, the one running, and one riding on its call (an identical request, which
    holds its place without taking a slot), give both back: a place held for good counted against `max_queue` for
    the rest of the process's life."""
    backend = ScriptedBackend("s", script=Script(pieces=["a"] * 20, delay=0.02))
    app = make_app(Config(batching=BatchingConfig(max_queue=2), limits=LimitsConfig(concurrency=4)), {"s": backend})
    async with TestClient(TestServer(app)) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        made = [await sdk.responses.create(model="tiny", input="hi", temperature=0, background=True, stream=stream)
                for _ in range(2)]
        ids = [m.id for m in made] if not stream else [(await m.__anext__()).response.id for m in made]
        for resp_id in reversed(ids):
            assert (await sdk.responses.cancel(resp_id)).status == "cancelled"
        for followed in made if stream else ():
            await followed.close()
        while app[BACKGROUND].runs:
            await asyncio.sleep(0.01)
        queue = app[GENERATIONS].current.pipeline.stage(Admit).controllers["s"]
        assert (queue.running, queue.queued, queue._reserved) == (0, 0, 0)
        assert app[GENERATIONS].current.pipeline.limit.limits.running() == {} and len(backend.requests) == 1
