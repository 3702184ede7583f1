"""The Responses API's store: what its memory tier counts against `[responses] max_bytes`; a shared tier down."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from adapters import bursts
from proxy.app import make_app
from proxy.cache.redis_store import RedisStore
from proxy.config import Config
from adapters.exact_json import dumps
from proxy.auth import ANONYMOUS
from proxy.responses_store import ResponsesConfig, ResponseStore, StoredResponse
from proxy.state import RESPONSES
from tests.scripted import Script, ScriptedBackend


async def test_a_response_read_back_from_sqlite_counts_as_much_memory_as_one_written_here(tmp_path):
    """Promoted from SQLite (after a restart, or by another process), an entry counted its payload's bytes alone, ~2.5x
    less than the same entry written here: max_bytes could be passed by that much."""
    config = ResponsesConfig(sqlite_path=str(tmp_path / "responses.db"))
    record = StoredResponse({"id": "resp_1", "output": [{"id": "msg_1", "type": "message", "content": "x" * 10_000}]},
                            [])
    here = await ResponseStore.open(config)
    await here.put("t", record)
    elsewhere = await ResponseStore.open(config)
    assert await elsewhere.get("t", "resp_1") is not None and await elsewhere.item("t", "msg_1") is not None
    assert elsewhere.memory.bytes_used == here.memory.bytes_used
    await here.close()
    await elsewhere.close()


async def test_storing_a_response_of_many_items_lets_other_tasks_run(monkeypatch):
    """Each item's entry is put at once where no tier waits (memory alone): 100,000 items held the event loop for
    ~0.3 s. Every item here passes the longest a task may run without letting others (adapters/bursts.py)."""
    monkeypatch.setattr(bursts, "BURST_S", -1.0)
    store, ran = await ResponseStore.open(ResponsesConfig()), []
    items = [{"id": f"msg_{n}", "type": "message", "content": "x"} for n in range(100)]

    async def other_task() -> None:
        while True:
            ran.append(None)
            await asyncio.sleep(0)
    other = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    before = len(ran)
    await store.put("t", StoredResponse({"id": "resp_1", "output": []}, items))
    assert len(ran) - before >= 50
    other.cancel()
    await store.close()


@pytest.mark.parametrize("hung", [False, True])
async def test_a_redis_down_or_hung_costs_no_answer_and_reads_say_so(client, base_url, hung: bool, caplog):
    """Redis down: a request whose answer was made failed with a 500 storing it, and a read of a response this
    process did not hold was a 500; Redis hung (a stopped process behind its open socket): each waited out the
    client's 5-s socket timeout first. The answer is kept here; a read that only Redis could answer is a 503."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1] if hung else 1
    down = RedisStore(aioredis.from_url(f"redis://127.0.0.1:{port}/0"), prefix="velo:responses:")
    client.server.app[RESPONSES].tiers.append(down)
    sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    started = time.monotonic()
    made = await sdk.responses.create(model="tiny", input="hi")
    assert made.output_text == "Hello world" and (await sdk.responses.retrieve(made.id)).id == made.id
    assert (await sdk.responses.create(model="tiny", input="more", previous_response_id=made.id)).output_text
    for read in (lambda: sdk.responses.retrieve("resp_elsewhere"), lambda: sdk.responses.delete(made.id),
                 lambda: sdk.responses.create(model="tiny", input="x", previous_response_id="resp_elsewhere")):
        with pytest.raises(openai.InternalServerError) as e:
            await read()
        assert e.value.status_code == 503 and "redis is unavailable" in e.value.message
    assert time.monotonic() - started < 4.5  # hung, the first store alone waited 5 s before
    assert "stored responses: redis failed on put" in caplog.text
    client.server.app[RESPONSES].tiers.remove(down)
    await down.close()
    server.close()


async def test_two_processes_on_one_redis_share_responses_and_their_deletion(redis_url: str):
    """A response deleted through one process was still read and continued through the other, which held a copy in
    memory from the request that stored it."""
    cfg = Config(responses=ResponsesConfig(redis_url=redis_url))
    cfg.server.api_keys = ["sk-a", "sk-b"]
    apps = [TestClient(TestServer(make_app(cfg, {"scripted": ScriptedBackend()}))) for _ in range(2)]
    for app in apps:
        await app.start_server()
    a, b, other = [openai.AsyncOpenAI(base_url=str(app.make_url("/v1")), api_key=key, max_retries=0)
                   for app, key in ((apps[0], "sk-a"), (apps[1], "sk-a"), (apps[1], "sk-b"))]
    made = await a.responses.create(model="tiny", input="hi")
    assert (await b.responses.retrieve(made.id)).output_text == "Hello world"
    assert [i.content[0].text for i in (await b.responses.input_items.list(made.id)).data] == ["hi"]
    assert (await b.responses.create(model="tiny", input="more", previous_response_id=made.id)).output_text
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(made.id)
    await b.responses.delete(made.id)
    for read in (lambda: a.responses.retrieve(made.id), lambda: a.responses.delete(made.id),
                 lambda: a.responses.create(model="tiny", input=[{"type": "item_reference", "id": made.output[0].id}])):
        with pytest.raises(openai.NotFoundError):
            await read()
    with pytest.raises(openai.BadRequestError, match="previous_response_not_found|not found"):
        await a.responses.create(model="tiny", input="x", previous_response_id=made.id)
    for app in apps:
        await app.close()


class RedisBack:
    """A shared tier that refused a write, then answers again without that key, as a Redis restarted does."""

    name, shared = "redis", True

    def __init__(self) -> None:
        self.rows: dict[str, tuple[bytes, float]] = {}
        self.down = True

    async def put(self, key: str, payload: bytes, expires_at: float) -> None:
        if self.down:
            raise ConnectionError("redis is down")
        self.rows[key] = payload, expires_at

    async def get(self, key: str) -> tuple[bytes, float] | None:
        return self.rows.get(key)

    async def holds(self, *keys: str) -> bool:
        return all(key in self.rows for key in keys)

    async def delete(self, key: str) -> bool:
        return self.rows.pop(key, None) is not None

    async def close(self) -> None:
        pass


async def test_a_response_whose_shared_write_failed_is_still_read_here_once_the_tier_is_back():
    """A copy here serves only while Redis holds its key (another process may have deleted it); a response Redis
    never took was then dropped as deleted the moment Redis answered again: stored, then a 404."""
    store = await ResponseStore.open(ResponsesConfig())
    store.tiers.append(tier := RedisBack())
    record = StoredResponse({"id": "resp_1", "output": [{"id": "msg_1", "type": "message", "content": "x"}]}, [])
    await store.put("t", record)
    tier.down = False
    store.tier_calls.resting.clear()  # the tier's rest after its failure is over
    assert await store.get("t", "resp_1") == record and (await store.item("t", "msg_1"))["id"] == "msg_1"
    await store.put("t", StoredResponse({**record.response, "id": "resp_2"}, []))
    assert await store.delete("t", "resp_2") and await store.get("t", "resp_2") is None
    assert await store.delete("t", "resp_1") and await store.get("t", "resp_1") is None
    await store.close()


async def _chain(client: TestClient, turns: int, output: str) -> list[str]:
    """A `previous_response_id` chain of `turns` responses, each sent one tool output after the first."""
    ids: list[str] = []
    for n in range(turns):
        turn = [{"type": "function_call_output", "call_id": f"call_{n}", "output": output}] if ids else "Go"
        made = await client.post("/v1/responses", json={"model": "tiny", "input": turn, **(
            {"previous_response_id": ids[-1]} if ids else {})})
        assert made.status == 200, await made.text()
        ids.append((await made.json())["id"])
    return ids


async def test_a_long_chain_stores_each_turns_own_items_once(client, scripted):
    """Each response kept a copy of the conversation before it: a chain of n turns stored O(n^2) bytes (40 turns of
    4 KB tool output: 3.3 MB for 0.16 MB of items), and a long agent session evicted every other response. Each keeps
    its own items and a link; the conversation is rebuilt by walking the links, and a row stored whole (before the
    links) still reads."""
    ids = await _chain(client, 40, "x" * 4096)
    store = client.server.app[RESPONSES]
    stored = [await store.get(ANONYMOUS, resp_id) for resp_id in ids]
    assert sum(len(dumps(record.__dict__)) for record in stored if record) < 2 * 40 * 4096
    assert [m.role for m in scripted.requests[-1].messages] == ["user"] + ["assistant", "tool"] * 39
    legacy = StoredResponse(**{"response": {"id": "resp_old", "output": []}, "input": [{"type": "message"}],
                               "history": [{"type": "message", "role": "user"}], "events": None})
    assert await store.conversation(ANONYMOUS, legacy) == [{"type": "message", "role": "user"}, {"type": "message"}]


async def test_a_chain_missing_an_earlier_response_is_a_400_that_names_it(client):
    """With each response holding the whole conversation, deleting an earlier one left later ones answering as if
    it were there; linked, the chain cannot be rebuilt past it: OpenAI's code (Codex then starts afresh), naming the
    response that is gone. The later response itself still reads, its input_items its own input only."""
    first, second, third = await _chain(client, 3, "out")
    assert (await client.delete(f"/v1/responses/{first}")).status == 200
    more = await client.post("/v1/responses", json={"model": "tiny", "input": "more", "previous_response_id": third})
    error = (await more.json())["error"]
    assert (more.status, error["code"], error["param"]) == (400, "previous_response_not_found", "previous_response_id")
    assert first in error["message"] and third in error["message"]
    assert (await (await client.get(f"/v1/responses/{third}")).json())["id"] == third
    listed = await (await client.get(f"/v1/responses/{third}/input_items")).json()
    assert [i["type"] for i in listed["data"]] == ["function_call_output"]


async def test_a_chain_sees_an_earlier_response_deleted_through_another_process(redis_url: str):
    """Each process holds copies of the chain's responses; one deleted through the other process is gone from the
    chain too, though the links are checked against Redis all at once."""
    cfg = Config(responses=ResponsesConfig(redis_url=redis_url))
    apps = [TestClient(TestServer(make_app(cfg, {"scripted": ScriptedBackend()}))) for _ in range(2)]
    for app in apps:
        await app.start_server()
    first, second, third = await _chain(apps[0], 3, "out")
    assert (await _chain_on(apps[0], third)).status == 200
    assert (await apps[1].delete(f"/v1/responses/{second}")).status == 200
    more = await _chain_on(apps[0], third)
    assert more.status == 400 and second in (await more.json())["error"]["message"]
    for app in apps:
        await app.close()


async def _chain_on(client: TestClient, previous: str) -> Any:
    return await client.post("/v1/responses", json={"model": "tiny", "input": "more", "previous_response_id": previous})


async def _streaming(sdk: openai.AsyncOpenAI) -> tuple[Any, str]:
    """A foreground stream (store on), read up to its first text: the stream, and the response's id."""
    stream = await sdk.responses.create(model="tiny", input="hi", stream=True)
    async for event in stream:
        if event.type == "response.created":
            resp_id = event.response.id
        if event.type == "response.output_text.delta":
            return stream, resp_id
    raise AssertionError("no text")


async def test_a_streamed_response_reads_in_progress_while_it_streams(base_url, scripted):
    """Not in the background, it was unknown until its end: GET and cancel were 404s. GET reads it in progress with
    the items done so far; cancel is OpenAI's 400 for a response not in the background; then it is stored."""
    scripted.script = Script(thinking="Let me think.", pieces=["Hel", "lo", " world"], delay=0.2)
    sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    stream, resp_id = await _streaming(sdk)
    found = await sdk.responses.retrieve(resp_id)
    assert (found.status, [item.type for item in found.output]) == ("in_progress", ["reasoning"])
    assert [i.content[0].text for i in (await sdk.responses.input_items.list(resp_id)).data] == ["hi"]
    with pytest.raises(openai.BadRequestError, match="Only responses created with background: true can be cancelled"):
        await sdk.responses.cancel(resp_id)
    async for _ in stream:
        pass
    assert (await sdk.responses.retrieve(resp_id)).status == "completed"


async def test_a_response_deleted_while_it_streams_stays_deleted(base_url, scripted):
    """A DELETE during the stream was a 404, and the response stored at its end anyway: the delete is kept."""
    scripted.script = Script(pieces=["Hel", "lo", " world"], delay=0.2)
    sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    stream, resp_id = await _streaming(sdk)
    await sdk.responses.delete(resp_id)
    async for event in stream:
        last = event
    assert last.type == "response.completed"
    for read in (lambda: sdk.responses.retrieve(resp_id), lambda: sdk.responses.delete(resp_id)):
        with pytest.raises(openai.NotFoundError):
            await read()
    with pytest.raises(openai.BadRequestError, match="not found"):
        await sdk.responses.create(model="tiny", input="x", previous_response_id=resp_id)
    scripted.script = Script(after_finish=0.5)  # stored, its stream still open: the delete finds it in the store
    stream = await sdk.responses.create(model="tiny", input="hi", stream=True)
    async for event in stream:
        if event.type == "response.completed":
            await sdk.responses.delete(event.response.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(event.response.id)
