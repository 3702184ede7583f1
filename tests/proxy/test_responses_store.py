"""The Responses API's store: what its memory tier counts against `[responses] max_bytes`; a shared tier down."""
from __future__ import annotations

import asyncio
import time

import openai
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import make_app
from proxy.cache.redis_store import RedisStore
from proxy.config import Config
from proxy.responses_store import ResponsesConfig, ResponseStore, StoredResponse
from proxy.state import RESPONSES
from tests.scripted import ScriptedBackend


async def test_a_response_read_back_from_sqlite_counts_as_much_memory_as_one_written_here(tmp_path):
    """Promoted from SQLite (after a restart, or by another process), an entry counted its payload's bytes alone, ~2.5x
    less than the same entry written here: max_bytes could be passed by that much."""
    config = ResponsesConfig(sqlite_path=str(tmp_path / "responses.db"))
    record = StoredResponse({"id": "resp_1", "output": [{"id": "msg_1", "type": "message", "content": "x" * 10_000}]},
                            [], [])
    here = await ResponseStore.open(config)
    await here.put("t", record)
    elsewhere = await ResponseStore.open(config)
    assert await elsewhere.get("t", "resp_1") is not None and await elsewhere.item("t", "msg_1") is not None
    assert elsewhere.memory.bytes_used == here.memory.bytes_used
    await here.close()
    await elsewhere.close()


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

    async def holds(self, key: str) -> bool:
        return key in self.rows

    async def delete(self, key: str) -> bool:
        return self.rows.pop(key, None) is not None

    async def close(self) -> None:
        pass


async def test_a_response_whose_shared_write_failed_is_still_read_here_once_the_tier_is_back():
    """A copy here serves only while Redis holds its key (another process may have deleted it); a response Redis
    never took was then dropped as deleted the moment Redis answered again: stored, then a 404."""
    store = await ResponseStore.open(ResponsesConfig())
    store.tiers.append(tier := RedisBack())
    record = StoredResponse({"id": "resp_1", "output": [{"id": "msg_1", "type": "message", "content": "x"}]}, [], [])
    await store.put("t", record)
    tier.down = False
    store.tier_calls.resting.clear()  # the tier's rest after its failure is over
    assert await store.get("t", "resp_1") == record and (await store.item("t", "msg_1"))["id"] == "msg_1"
    await store.put("t", StoredResponse({**record.response, "id": "resp_2"}, [], []))
    assert await store.delete("t", "resp_2") and await store.get("t", "resp_2") is None
    assert await store.delete("t", "resp_1") and await store.get("t", "resp_1") is None
    await store.close()
