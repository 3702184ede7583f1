"""Shared exact tier: several Velo processes pointing at one Redis share answers. Redis enforces the TTL."""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

_EXPIRY = struct.Struct("<d")  # each value starts with its absolute expiry, so a reader can copy it down


@dataclass
class RedisStore:
    client: aioredis.Redis
    name: str = "redis"
    prefix: str = "velo:cache:"  # keys of each user of the Redis (the cache, stored responses) apart
    shared = True  # other processes write and delete its entries

    @classmethod
    async def open(cls, url: str, prefix: str = "velo:cache:") -> "RedisStore":
        client = aioredis.from_url(url)
        await client.ping()  # fail at start-up, not at the first request
        return cls(client, prefix=prefix)

    async def get(self, key: str) -> tuple[bytes, float] | None:
        raw = await self.client.get(self.prefix + key)
        if raw is None:
            return None
        (expires_at,) = _EXPIRY.unpack_from(raw)
        return raw[_EXPIRY.size:], expires_at

    async def holds(self, *keys: str) -> bool:
        """Whether it holds every one of `keys` (one round trip for all)."""
        return await self.client.exists(*(self.prefix + key for key in keys)) == len(keys)

    async def put(self, key: str, payload: bytes, expires_at: float) -> None:
        ttl_ms = int((expires_at - time.time()) * 1000)
        if ttl_ms > 0:
            await self.client.set(self.prefix + key, _EXPIRY.pack(expires_at) + payload, px=ttl_ms)

    async def delete(self, key: str) -> bool:
        return bool(await self.client.delete(self.prefix + key))

    async def close(self) -> None:
        await self.client.aclose()
