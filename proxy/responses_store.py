"""Responses kept for `previous_response_id`, `item_reference` and `GET` / `DELETE /v1/responses/{id}` (`store:
true`, OpenAI's default): in memory, bounded by bytes and expiring after `[responses] ttl_s`, and in SQLite or Redis
when configured (the cache's own tier classes). Scoped per API key: another key gets 404, never the response."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable


from adapters.bursts import Burst
from adapters.errors import BadRequest, VeloError
from adapters.exact_json import dumps, loads
from adapters.schema import setting

from .cache.config import check_redis_url
from .cache.layer import FAILED, TierCalls
from .cache.memory import MemoryLRU

log = logging.getLogger("velo.responses")


class StoreUnavailable(VeloError):
    """A tier of the store (Redis) is down and this process holds no copy: whether the response exists is not
    known, so not a 404; worth retrying once the tier is back."""

    status = 503
    kind = "service_unavailable"


class EarlierResponseGone(BadRequest):
    """A response continued by id whose chain lost an earlier response (deleted, expired, evicted): answering without
    it would answer another conversation. OpenAI's code for a missing previous response, on which Codex starts the
    chain afresh, sending the whole conversation."""

    code = "previous_response_not_found"

    def __init__(self, previous: str, gone: str, why: str = "is no longer stored (deleted, expired or evicted)"):
        super().__init__(f"Previous response with id '{previous}' cannot be continued: the earlier response '{gone}' "
                         f"in its chain {why}.", param="previous_response_id")


# Links a rebuilt conversation follows at most: ids never form a cycle (a response names one stored before it), so
# this bounds the reads of one request, not a loop; 10,000 links read from memory take ~10 ms.
MAX_CHAIN = 10_000


@dataclass
class ResponsesConfig:
    """Stored responses of the Responses API (store: true), for previous_response_id and GET/DELETE."""

    ttl_s: float = setting(30 * 86400.0, "seconds a stored response stays retrievable (OpenAI keeps them 30 days)",
                           min=0)
    max_bytes: int = setting(64 * 1024 * 1024, "bound of the in-process store; the least recently used go first",
                             min=0)
    sqlite_path: str | None = setting(None, "a SQLite file that keeps stored responses across restarts",
                                      default_doc="none (memory only)")
    redis_url: str | None = setting(None, "a Redis shared by several Velo processes, which then share stored "
                                    "responses", default_doc="none")

    def __post_init__(self) -> None:
        check_redis_url(self.redis_url, "redis_url")


@dataclass
class StoredResponse:
    """A response and its own input only, linked to the one it continued: each kept a copy of the whole conversation
    before it, so a chain of n turns stored O(n^2) bytes (200 turns of 4 KB tool output: 88 MB for 0.8 MB of items,
    and the default 64 MiB bound kept the last 33 responses, evicting everything else; bench/responses_chain.py)."""

    response: dict[str, Any]  # the response object as the client got it
    input: list[dict[str, Any]]  # the input items of its request, which `input_items` lists, as OpenAI's does
    previous: str | None = None  # the id of the response it continued (`previous_response_id`)
    events: str | None = None  # a background response's stream, packed (proxy/background.py), sent again on request
    history: list[dict[str, Any]] = field(default_factory=list)  # the conversation before, whole: rows stored
    # before responses were linked, which SQLite and Redis still hold

    def own(self) -> list[dict[str, Any]]:
        """What this response adds to the conversation (after its `history`, in a row stored before links)."""
        return self.history + self.input + self.response["output"]

    def kept(self) -> bool:
        """Whether it was stored (`store: true`), not kept for polling only (a background response with `store:
        false`): only then does a later request continue it or name its items."""
        return self.response.get("store") is not False

    def items(self) -> list[dict[str, Any]]:
        """The items this response made or was sent, each with its id, which an `item_reference` names."""
        return self.input + self.response["output"]


@dataclass
class ResponseStore:
    cfg: ResponsesConfig
    memory: MemoryLRU
    tiers: list[Any]  # SqliteStore / RedisStore, nearest first
    # with Redis down, a request storing its response failed with a 500 once its answer was made, and with Redis hung
    # each read and write waited out the client's 5-s socket timeout
    tier_calls: TierCalls = field(default_factory=lambda: TierCalls(log, "stored responses:"))
    only_here: set[str] = field(default_factory=set)  # keys a shared tier failed to take: this process's copy is all

    @classmethod
    async def open(cls, cfg: ResponsesConfig, clock: Callable[[], float] = time.time) -> "ResponseStore":
        tiers: list[Any] = []
        if cfg.sqlite_path:
            from .cache.sqlite_store import SqliteStore
            tiers.append(await SqliteStore.open(cfg.sqlite_path, cfg.max_bytes, clock))
        if cfg.redis_url:
            from .cache.redis_store import RedisStore
            tiers.append(await RedisStore.open(cfg.redis_url, prefix="velo:responses:"))
        return cls(cfg, MemoryLRU(cfg.max_bytes, clock), tiers)

    async def close(self) -> None:
        for tier in self.tiers:
            await tier.close()

    async def put(self, tenant: str, record: StoredResponse, ttl_s: float | None = None) -> None:
        """The response, and for each of its items the response's id (the AI SDK sends earlier turns back as
        `item_reference`s to their ids, `store` being on by default); for `ttl_s`, or `[responses] ttl_s`. An item an
        earlier response holds (named by a reference, or sent back with its id) stays that response's: taken over,
        it was gone with the later response's deletion while the earlier one still held it."""
        resp_id, ttl_s = record.response["id"], self.cfg.ttl_s if ttl_s is None else min(ttl_s, self.cfg.ttl_s)
        await self._put(_key(tenant, resp_id), record, dumps(record.__dict__), ttl_s)
        burst = Burst()  # its items' entries, each put at once where no tier waits: 100,000 held the loop ~0.3 s
        for item in record.items() if record.kept() else []:
            key = _item_key(tenant, item["id"])
            if await self._owner(key) in (None, resp_id):
                await self._put(key, resp_id, resp_id.encode(), ttl_s)
            await burst.pause()

    async def _owner(self, item_key: str) -> str | None:
        """The id of the response holding an item; None where no tier can say (the answer was already made)."""
        try:
            return await self._get(item_key, bytes.decode)
        except StoreUnavailable:
            return None

    async def _put(self, key: str, value: Any, payload: bytes, ttl_s: float) -> None:
        """A tier that fails leaves the response in this process only: its answer was already made."""
        self.memory.put_encoded(key, value, len(payload), ttl_s)
        expires_at = self.memory.clock() + ttl_s
        for tier in self.tiers:
            put = await self.tier_calls(tier.name, "put", lambda tier=tier: tier.put(key, payload, expires_at))
            if put is FAILED and tier.shared:
                self.only_here.add(key)

    async def get(self, tenant: str, resp_id: str) -> StoredResponse | None:
        if ":" in resp_id:  # never one of Velo's ids; "item:<id>" would read an item's entry as a response (a 500)
            return None
        return await self._get(_key(tenant, resp_id), lambda payload: StoredResponse(**loads(payload)))

    async def conversation(self, tenant: str, record: StoredResponse, checked: bool = False) -> list[dict[str, Any]]:
        """What a response continuing `record` follows: the conversation rebuilt by walking its links back, then its
        own input and output. The copies held here are checked against a shared tier (Redis) all at once (200 links
        checked one by one took 26.4 ms a turn, 0.57 ms so); one gone, the walk is made again, each link read as `get`
        reads it, which drops that copy."""
        chain, here = [record], []
        while (previous := chain[-1].previous) is not None:
            if len(chain) == MAX_CHAIN:
                raise EarlierResponseGone(record.response["id"], previous, f"is more than {MAX_CHAIN} responses back")
            key = _key(tenant, previous)
            if not checked and key not in self.only_here and (earlier := self.memory.get(key)) is not None:
                here.append(key)
            elif (earlier := await self.get(tenant, previous)) is None:
                raise EarlierResponseGone(record.response["id"], previous)
            chain.append(earlier)
        if here and not await self._shared_hold(here):
            return await self.conversation(tenant, record, checked=True)
        return [item for stored in reversed(chain) for item in stored.own()]

    async def item(self, tenant: str, item_id: str) -> dict[str, Any] | None:
        """The stored item with this id, from the response that made or was sent it."""
        resp_id = await self._get(_item_key(tenant, item_id), bytes.decode)
        record = None if resp_id is None else await self.get(tenant, resp_id)
        return None if record is None else next((i for i in record.items() if i["id"] == item_id), None)

    async def _get(self, key: str, decode: Callable[[bytes], Any]) -> Any | None:
        """This process's copy while a shared tier (Redis) still holds the key: another process may have deleted the
        response, which the copy here kept serving. Otherwise the shared tier first, whose miss is final."""
        if (here := self.memory.get(key)) is not None:
            return here if key in self.only_here or await self._still_shared(key) else None
        self.only_here.discard(key)  # evicted here, or expired
        failed = []
        for tier in sorted(self.tiers, key=lambda tier: not tier.shared):
            row = await self.tier_calls(tier.name, "get", lambda tier=tier: tier.get(key))
            if row is FAILED:
                failed.append(tier.name)
            elif row is not None:
                payload, expires_at = row
                value = decode(payload)
                self.memory.put_encoded(key, value, len(payload), expires_at - self.memory.clock())
                return value
            elif tier.shared:  # deleted, or expired, by whichever process
                return None
        if failed:
            raise StoreUnavailable(f"stored responses cannot be read: {', '.join(failed)} is unavailable")
        return None

    async def _still_shared(self, key: str) -> bool:
        """Whether no shared tier says it lost `key` (deleted or expired by another process); one that is down says
        nothing. Whether the key is there is enough, entries never being changed: reading each whole decoded a long
        conversation again for each of its items that an `item_reference` named (44 ms for 100 items, 0.4 from
        memory)."""
        if not await self._shared_hold([key]):
            self.memory.delete(key)
            return False
        return True

    async def _shared_hold(self, keys: list[str]) -> bool:
        """Whether no shared tier says it lost one of `keys`; one that is down says nothing."""
        for tier in (tier for tier in self.tiers if tier.shared):
            if await self.tier_calls(tier.name, "get", lambda tier=tier: tier.holds(*keys)) is False:
                return False
        return True

    async def delete(self, tenant: str, resp_id: str) -> bool:
        """The response, and the references to the items it holds (not those an earlier response holds)."""
        if (record := await self.get(tenant, resp_id)) is None:
            return False
        items = [_item_key(tenant, i["id"]) for i in record.items()]
        keys = [_key(tenant, resp_id)] + [key for key in items if await self._get(key, bytes.decode) == resp_id]
        deleted = False
        for key in keys:
            for tier in self.tiers:
                gone = await self.tier_calls(tier.name, "delete", lambda tier=tier: tier.delete(key))
                if gone is FAILED:
                    raise StoreUnavailable(f"the response could not be deleted: {tier.name} is unavailable")
                deleted = gone or deleted
            deleted = self.memory.delete(key) or deleted
            self.only_here.discard(key)
        return deleted


def _key(tenant: str, resp_id: str) -> str:
    return f"{tenant}:{resp_id}"


def _item_key(tenant: str, item_id: str) -> str:
    return f"{tenant}:item:{item_id}"
