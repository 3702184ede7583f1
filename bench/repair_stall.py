"""How long a pathological model answer stalls Velo's event loop on its way through tool-call / JSON repair.

A scripted backend answers with `N` characters of `{` (what a small model stuck in a loop writes when it is
offered tools or asked for JSON), once as one chunk (a non-streamed backend answer) and once in 16-character
pieces (a stream, handing the loop back between pieces as a socket read does); while that request runs, a probe
on the same event loop sleeps 5 ms at a time and records how late it wakes up: the longest lateness is the stall
every other client of this Velo would have felt. The
request's wall time, status and `X-Velo-Repair` header are printed beside it.

    python bench/repair_stall.py [--sizes 32768,2097152] [--timeout 300]

The baseline is the same cases with repair off (`[tools] repair = false`), in the same run.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import AsyncIterator

import aiohttp
from aiohttp.test_utils import TestServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.protocol import Chunk  # noqa: E402
from proxy.app import make_app  # noqa: E402
from proxy.cache.config import CacheConfig  # noqa: E402
from proxy.config import Config, ToolsConfig  # noqa: E402
from tests.scripted import Script, ScriptedBackend  # noqa: E402

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
PROBE_S = 0.005


class Streaming(ScriptedBackend):
    """Hands the event loop back between pieces, as a backend read from a socket does."""

    async def _run(self) -> AsyncIterator[Chunk]:  # type: ignore[override]
        async for chunk in super()._run():
            await asyncio.sleep(0)
            yield chunk


async def probe(stop: asyncio.Event, worst: list[float]) -> None:
    while not stop.is_set():
        asked = time.perf_counter()
        await asyncio.sleep(PROBE_S)
        worst[0] = max(worst[0], time.perf_counter() - asked - PROBE_S)


async def one(size: int, piece: int, ask: str, repair: bool, timeout: float) -> str:
    text = "{" * size
    pieces = [text[i:i + piece] for i in range(0, size, piece)]
    backend = Streaming("s", script=Script(pieces=pieces))
    config = Config(cache=CacheConfig(enabled=False), tools=ToolsConfig(repair=repair))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": False}
    body.update({"tools": [TOOL]} if ask == "tools" else {"response_format": {"type": "json_object"}})
    stop, worst = asyncio.Event(), [0.0]
    async with TestServer(make_app(config, {"s": backend})) as server, aiohttp.ClientSession() as s:
        watcher = asyncio.create_task(probe(stop, worst))
        started = time.perf_counter()
        try:
            async with s.post(server.make_url("/v1/chat/completions"), json=body,
                              timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await resp.read()
                status, note = resp.status, resp.headers.get("X-Velo-Repair", "-")
        except asyncio.TimeoutError:
            status, note = 0, f"no answer within {timeout:g} s"
        wall = time.perf_counter() - started
        stop.set()
        await watcher
    return f"{wall * 1000:9.0f} {worst[0] * 1000:9.1f} {status:4d}  {note[:70]}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="32768,2097152")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    print(f"{'answer':>28} {'repair':>6} {'wall ms':>9} {'stall ms':>9} {'code':>4}  X-Velo-Repair")
    for size in (int(s) for s in args.sizes.split(",")):
        for piece, shape in ((size, "one chunk"), (16, "16-char pieces")):
            for ask in ("tools", "json"):
                for repair in (False, True):
                    line = await one(size, piece, ask, repair, args.timeout)
                    label = f"{size:>8} x {{ {shape}, {ask}"
                    print(f"{label:>28} {'on' if repair else 'off':>6} {line}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
