"""What heartbeats buy and cost: the longest silence a client sees while a tool call is written or a prompt is read,
and the time a plain stream takes through Velo with the heartbeats' timer.

A scripted backend writes a tool call in `--pieces` pieces `--gap` seconds apart (a small model on a CPU writing a
file-sized call); Velo holds the call back until it is complete, so with no heartbeats the client hears nothing,
not even headers, until the end. The same backend also sends nothing for as long before its answer (Ollama reading
a long prompt). With `server.heartbeat_s` the client hears the headers and an empty event every `heartbeat_s`. The
cost is read on a stream of `--words` text pieces sent as fast as the backend makes them.

    python bench/heartbeat.py [--pieces 60] [--gap 0.05] [--beat 0.5] [--words 20000] [--rounds 5]

The baseline is the same requests with `heartbeat_s = 0` (no timer), in the same run, interleaved.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.app import make_app  # noqa: E402
from proxy.cache.config import CacheConfig  # noqa: E402
from proxy.config import Config, ServerConfig  # noqa: E402
from tests.scripted import Script, ScriptedBackend  # noqa: E402

TOOL = {"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}
MESSAGES = [{"role": "user", "content": "Write the file."}]


def _call(pieces: int) -> list[str]:
    body = "x = 1\\n" * pieces
    text = '<tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "' + body + '"}}</tool_call>'
    size = -(-len(text) // pieces)
    return [text[i:i + size] for i in range(0, len(text), size)]


def _server(beat: float, script: Script) -> TestServer:
    """Velo over a scripted backend, started and closed by `async with`."""
    config = Config(server=ServerConfig(heartbeat_s=beat), cache=CacheConfig(enabled=False))
    return TestServer(make_app(config, {"scripted": ScriptedBackend(script=script)}))


async def _silences(server: TestServer) -> tuple[float, float, float]:
    """Seconds to the first byte, the longest gap between reads, and the whole request."""
    async with aiohttp.ClientSession() as http:
        start = time.perf_counter()
        async with http.post(server.make_url("/v1/chat/completions"), json={
                "model": "tiny", "messages": MESSAGES, "tools": [TOOL], "stream": True}) as resp:
            last, first, longest = start, None, 0.0
            async for _ in resp.content.iter_any():
                now = time.perf_counter()
                first = first if first is not None else now - start
                longest, last = max(longest, now - last), now
        return first or 0.0, longest, time.perf_counter() - start


async def _plain(server: TestServer) -> float:
    """CPU seconds of this process (Velo and the client share it) for one plain stream."""
    async with aiohttp.ClientSession() as http:
        cpu = time.process_time()
        async with http.post(server.make_url("/v1/chat/completions"), json={
                "model": "tiny", "messages": MESSAGES, "stream": True}) as resp:
            await resp.read()
        return time.process_time() - cpu


async def main(args: argparse.Namespace) -> None:
    waits = {"held call": Script(pieces=_call(args.pieces), delay=args.gap),
             "silent prompt read": Script(silence=args.pieces * args.gap)}
    plain = Script(pieces=[f" w{i}" for i in range(args.words)])
    sides = {"heartbeat": args.beat, "off": 0.0}
    seen: dict[tuple[str, str], list[tuple[float, float, float]]] = {(w, s): [] for w in waits for s in sides}
    cost: dict[str, list[float]] = {s: [] for s in sides}
    for _ in range(args.rounds):
        for side, beat in sides.items():
            for wait, script in waits.items():
                async with _server(beat, script) as server:
                    seen[wait, side].append(await _silences(server))
            async with _server(beat, plain) as server:
                await _plain(server)  # warm
                cost[side].append(statistics.median([await _plain(server) for _ in range(3)]))
    print(f"{args.pieces} pieces {args.gap:g} s apart (a held call), or as long silent (a prompt read); heartbeat_s "
          f"{args.beat:g}; {args.rounds} interleaved rounds (medians)")
    for wait in waits:
        longest = {}
        for side in sides:
            first, longest[side], whole = (statistics.median(x) for x in zip(*seen[wait, side]))
            print(f"  {wait:18} {side:9} first byte {first:6.2f} s   longest silence {longest[side]:6.2f} s   "
                  f"whole {whole:6.2f} s")
        print(f"  {wait}: longest silence with heartbeats {longest['heartbeat'] / longest['off']:.2f}x of without")
    per_on, per_off = (statistics.median(cost[s]) / args.words * 1e6 for s in sides)
    print(f"plain stream of {args.words} pieces, CPU a piece (Velo + client): heartbeat {per_on:.1f} us, "
          f"off {per_off:.1f} us: {per_on / per_off:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pieces", type=int, default=60)
    parser.add_argument("--gap", type=float, default=0.05)
    parser.add_argument("--beat", type=float, default=0.5)
    parser.add_argument("--words", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
