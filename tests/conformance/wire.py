"""Raw HTTP for the conformance tests: the bytes as a client receives them, parsed but not interpreted."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

BYPASS = {"Cache-Control": "no-cache"}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    def ndjson(self) -> list[Any]:
        return [orjson.loads(line) for line in self.body.splitlines() if line.strip()]

    def sse(self) -> list[Any]:
        """The `data:` events in order; `[DONE]` stays a string."""
        events = []
        for block in self.body.decode().split("\n\n"):
            data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
            if data:
                events.append("[DONE]" if data[0] == "[DONE]" else orjson.loads(data[0]))
        return events


async def call(url: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Answer:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url + path, json=body, headers=headers) as resp:
            return Answer(resp.status, dict(resp.headers), await resp.read())


async def replayed(url: str, path: str, body: dict[str, Any], warm: dict[str, Any]) -> Answer:
    """`body` answered from the cache: `warm` (the same request, perhaps not streamed) is sent first."""
    first = await call(url, "POST", path, warm)
    assert first.status == 200, first.body
    return await call(url, "POST", path, body)


async def answer(url: str, path: str, body: dict[str, Any], mode: str, warm: dict[str, Any]) -> Answer:
    """`mode` "fresh": from the backend (cache bypassed); "replay": from the exact cache."""
    got = await call(url, "POST", path, body, BYPASS) if mode == "fresh" else await replayed(url, path, body, warm)
    assert got.status == 200, got.body
    assert got.headers["X-Velo-Cache"] == ("bypass" if mode == "fresh" else "exact")
    return got
