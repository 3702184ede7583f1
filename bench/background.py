"""What background responses (`background: true`, proxy/background.py) cost and buy, against the same answer asked
without `background`, in the same run, interleaved:
- the wait for the request to return: a background request returns queued at once, where a plain one returns
  with the whole answer (a scripted backend writes `--slow` pieces `--gap` seconds apart);
- CPU a piece of a streamed answer of `--words` pieces as fast as the backend makes them (Velo and the client
  share this process): the task writing the event log and the request following it, against the plain stream;
- bytes stored for the response: its events are kept with it, so a dropped stream is followed again with the
  numbers it had.

    python bench/background.py [--words 20000] [--slow 40] [--gap 0.025] [--rounds 5]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import orjson
from aiohttp.test_utils import TestServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.app import make_app  # noqa: E402
from proxy.auth import ANONYMOUS  # noqa: E402
from proxy.cache.config import CacheConfig  # noqa: E402
from proxy.config import Config  # noqa: E402
from proxy.state import RESPONSES  # noqa: E402
from tests.scripted import Script, ScriptedBackend  # noqa: E402

BODY = {"model": "tiny", "input": "Write."}


async def _returned(http: aiohttp.ClientSession, server: TestServer, background: bool) -> tuple[float, str]:
    """Seconds until the request returned, and the response's id."""
    start = time.perf_counter()
    async with http.post(server.make_url("/v1/responses"), json={**BODY, "background": background}) as resp:
        made = await resp.json()
    return time.perf_counter() - start, made["id"]


async def _streamed(http: aiohttp.ClientSession, server: TestServer, background: bool) -> tuple[float, str]:
    """CPU seconds of this process for one streamed answer, and the response's id."""
    cpu = time.process_time()
    async with http.post(server.make_url("/v1/responses"),
                         json={**BODY, "stream": True, "background": background}) as resp:
        text = await resp.text()
    created = orjson.loads(text.split("\n", 2)[1].removeprefix("data: "))
    return time.process_time() - cpu, created["response"]["id"]


async def _until_done(http: aiohttp.ClientSession, server: TestServer, resp_id: str) -> None:
    while True:
        async with http.get(server.make_url(f"/v1/responses/{resp_id}")) as resp:
            if (await resp.json())["status"] not in ("queued", "in_progress"):
                return
        await asyncio.sleep(0.01)


async def _stored_bytes(server: TestServer, resp_id: str) -> int:
    record = await server.app[RESPONSES].get(ANONYMOUS, resp_id)
    assert record is not None
    return len(orjson.dumps(record.__dict__))


async def main(args: argparse.Namespace) -> None:
    slow = ScriptedBackend(script=Script(pieces=[f" w{i}" for i in range(args.slow)], delay=args.gap))
    fast = ScriptedBackend(script=Script(pieces=[f" w{i}" for i in range(args.words)]))
    config = Config(cache=CacheConfig(enabled=False))
    seen: dict[str, dict[bool, list[float]]] = {k: {True: [], False: []} for k in ("returned", "cpu", "bytes")}
    async with TestServer(make_app(config, {"s": slow})) as slow_velo, \
            TestServer(make_app(config, {"s": fast})) as fast_velo, aiohttp.ClientSession() as http:
        for _ in range(args.rounds):
            for background in (True, False):
                wait, resp_id = await _returned(http, slow_velo, background)
                await _until_done(http, slow_velo, resp_id)
                cpu, resp_id = await _streamed(http, fast_velo, background)
                await _until_done(http, fast_velo, resp_id)
                seen["returned"][background].append(wait)
                seen["cpu"][background].append(cpu / args.words)
                seen["bytes"][background].append(await _stored_bytes(fast_velo, resp_id))
    med = {k: {b: statistics.median(v) for b, v in sides.items()} for k, sides in seen.items()}
    print(f"{args.rounds} rounds, medians; baseline: the same request without background")
    print(f"returned after ({args.slow} pieces {args.gap} s apart): {med['returned'][True] * 1e3:.1f} ms against "
          f"{med['returned'][False] * 1e3:.1f} ms ({med['returned'][True] / med['returned'][False]:.3f}x)")
    print(f"CPU a piece, streamed ({args.words} pieces): {med['cpu'][True] * 1e6:.1f} us against "
          f"{med['cpu'][False] * 1e6:.1f} us ({med['cpu'][True] / med['cpu'][False]:.2f}x)")
    print(f"bytes stored: {med['bytes'][True] / 1e6:.2f} MB against {med['bytes'][False] / 1e6:.2f} MB "
          f"({med['bytes'][True] / med['bytes'][False]:.1f}x; "
          f"{(med['bytes'][True] - med['bytes'][False]) / args.words:.0f} B an event)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--words", type=int, default=20000)
    p.add_argument("--slow", type=int, default=40)
    p.add_argument("--gap", type=float, default=0.025)
    p.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(p.parse_args()))
