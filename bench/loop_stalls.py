"""How long one large request holds the event loop that every other request shares, against the same work done the
way it was before, in the same run:

- a full garbage collection in a serving process (the engine and the semantic tier loaded: ~500k objects alive),
  with what the start left alive frozen out of the collector's sight (`velo serve` does it) and without;
- the replay of a 60,000-piece cached answer, in bursts of at most 5 ms (adapters/bursts.py `BURST_S`) and in one
  burst, as before; the figure is the longest another task waited.

    python bench/loop_stalls.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from adapters import bursts  # noqa: E402
from proxy.app import make_app  # noqa: E402
from proxy.config import Config, parse_config  # noqa: E402
from tests.loop_watch import loop_gaps  # noqa: E402
from tests.scripted import Script, ScriptedBackend  # noqa: E402

PIECES = 60_000
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, "temperature": 0}


def full_collection_ms(frozen: bool) -> float:
    if frozen:
        gc.freeze()
    try:
        started = time.perf_counter()
        gc.collect()
        return (time.perf_counter() - started) * 1000
    finally:
        gc.unfreeze()


async def replay_held_ms(client: TestClient, burst_s: float) -> float:
    """The longest another task waited while the cached answer was replayed."""
    bursts.BURST_S = burst_s

    async def replayed() -> None:
        resp = await client.post("/v1/chat/completions", json=CHAT)
        body = await resp.read()
        assert resp.headers["X-Velo-Cache"] == "exact" and body.count(b"w ") == PIECES
    _, gaps = await loop_gaps(replayed(), every=0)
    return max(gaps) * 1000


async def main(rounds: int) -> None:
    heavy = make_app(parse_config({"cache": {"semantic": True}}))  # the shipped model on the engine, the encoder
    async with TestClient(TestServer(heavy)):
        gc.collect()
        print(f"objects the collector tracks in a serving process: {len(gc.get_objects()):,}")
        collections = []
        for r in range(rounds):
            collections.append((full_collection_ms(True), full_collection_ms(False)))
            print(f"round {r}: a full collection {collections[-1][0]:.1f} ms frozen, {collections[-1][1]:.1f} ms "
                  "not", flush=True)
    burst = bursts.BURST_S
    backend = ScriptedBackend(script=Script(pieces=["w "] * PIECES))
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as client:
        await (await client.post("/v1/chat/completions", json=CHAT)).read()  # cached
        replays = []
        for r in range(rounds):
            replays.append((await replay_held_ms(client, burst), await replay_held_ms(client, float("inf"))))
            print(f"round {r}: a {PIECES:,}-piece replay held the loop {replays[-1][0]:.1f} ms in bursts, "
                  f"{replays[-1][1]:.1f} ms in one", flush=True)
    bursts.BURST_S = burst
    frozen, thawed = (statistics.median(c[i] for c in collections) for i in range(2))
    in_bursts, whole = (statistics.median(c[i] for c in replays) for i in range(2))
    print(f"median: a full collection {frozen:.1f} ms frozen against {thawed:.1f} ms ({frozen / thawed:.3f}x); a "
          f"{PIECES:,}-piece replay held the loop {in_bursts:.1f} ms against {whole:.1f} ms ({in_bursts / whole:.2f}x)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(ap.parse_args().rounds))
