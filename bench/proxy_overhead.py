"""What Velo costs on the request path: the same OpenAI-dialect requests sent straight to an upstream and through
Velo, in the same run, reported as ratios against the direct baseline.

Two upstreams: a fast fake (tests/fakes.py FakeOpenAI, no delay: the proxy's own cost dominates) and the real
llama-server with SmolLM2-135M (tests/llama_server.py: what a user feels). Upstream, Velo and this client each run
in their own process; direct and proxied requests alternate so machine noise hits both alike. Velo's response
cache is off (it would answer from memory, which measures the cache, not the path).

    python bench/proxy_overhead.py [--requests 200] [--stream-words 256] [--skip-llama]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.llama_server import chat_server, free_port  # noqa: E402

MSG = [{"role": "user", "content": "Say hello"}]
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


def _run_fake(urls: multiprocessing.Queue, words: int) -> None:
    from tests.fakes import FakeOpenAI

    async def run() -> None:
        async with FakeOpenAI(models=["fake"]) as fake:
            fake.script.reply = " ".join(["word"] * words)
            urls.put(fake.url)
            await asyncio.Event().wait()
    asyncio.run(run())


def _run_velo(port: int, kind: str, upstream: str) -> None:
    from adapters.base import BackendConfig
    from proxy.cache.config import CacheConfig
    from proxy.cli import serve
    from proxy.config import Config, ServerConfig

    cfg = Config(server=ServerConfig(port=port), backends=[BackendConfig(name="up", kind=kind, urls=[upstream])],
                 cache=CacheConfig(enabled=False))
    asyncio.run(serve(cfg))


def _spawn(target, *args) -> multiprocessing.Process:
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


async def _wait_up(session: aiohttp.ClientSession, url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.get(url + "/v1/models") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up within {timeout:g}s")


async def _once(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, int]:
    """Seconds for one request, and the content pieces it streamed (1 when not streamed).

    llama-server closes connections idle for 5 s; a request that met such a stale one is timed again afresh."""
    try:
        return await _timed(session, url, body)
    except aiohttp.ServerDisconnectedError:
        return await _timed(session, url, body)


async def _timed(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, int]:
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        if not body.get("stream"):
            await resp.read()
            return time.perf_counter() - started, 1
        pieces = 0
        async for line in resp.content:
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                pieces += 1
    return time.perf_counter() - started, pieces


@dataclass
class Pair:
    """Measurements of the same workload direct and through Velo."""

    direct: list[float]
    velo: list[float]


async def latency(session: aiohttp.ClientSession, direct: str, velo: str, body: dict, n: int) -> Pair:
    out = Pair([], [])
    for i in range(n):
        sides = [(direct, out.direct), (velo, out.velo)]
        for url, sink in sides[::-1] if i % 2 else sides:
            sink.append((await _once(session, url, body))[0])
    return out


async def throughput(session: aiohttp.ClientSession, direct: str, velo: str, body: dict, rounds: int,
                     concurrent: int) -> Pair:
    """Streamed content pieces per second, `concurrent` streams at once, for each round."""
    out = Pair([], [])
    for i in range(rounds):
        sides = [(direct, out.direct), (velo, out.velo)]
        for url, sink in sides[::-1] if i % 2 else sides:  # neither side always runs on a warmer server
            started = time.perf_counter()
            results = await asyncio.gather(*(_once(session, url, body) for _ in range(concurrent)))
            sink.append(sum(p for _, p in results) / (time.perf_counter() - started))
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def report(name: str, lat: Pair, tput: Pair, unit: str) -> None:
    for q in (50, 99):
        d, v = pct(lat.direct, q) * 1e3, pct(lat.velo, q) * 1e3
        print(f"{name:14} latency p{q}   direct {d:9.2f} ms   velo {v:9.2f} ms   ratio {v / d:5.2f}x  ({v - d:+.2f} ms)")
    d, v = statistics.median(tput.direct), statistics.median(tput.velo)
    print(f"{name:14} stream median direct {d:9.1f} {unit}   velo {v:9.1f} {unit}   ratio {v / d:5.2f}x")


async def bench_pair(name: str, direct: str, velo: str, requests: int, short: dict, long: dict, rounds: int,
                     concurrent: int, unit: str) -> None:
    async with aiohttp.ClientSession() as probe:  # its own: a connection idle while Velo starts goes stale
        await _wait_up(probe, direct)
        await _wait_up(probe, velo)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await latency(session, direct, velo, short, 5)  # warm connections and caches
        lat = await latency(session, direct, velo, short, requests)
        tput = await throughput(session, direct, velo, long, rounds, concurrent)
    print(f"{name:14} {requests} sequential requests, {rounds} rounds of {concurrent} concurrent streams")
    report(name, lat, tput, unit)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200, help="sequential requests per side (fake upstream)")
    ap.add_argument("--stream-words", type=int, default=256, help="pieces per streamed answer (fake upstream)")
    ap.add_argument("--llama-requests", type=int, default=20)
    ap.add_argument("--llama-tokens", type=int, default=64)
    ap.add_argument("--skip-llama", action="store_true")
    args = ap.parse_args()

    urls = multiprocessing.get_context("spawn").Queue()
    procs = [_spawn(_run_fake, urls, args.stream_words)]
    fake, velo_port = urls.get(timeout=60), free_port()
    velo = f"http://127.0.0.1:{velo_port}"
    procs.append(_spawn(_run_velo, velo_port, "openai", fake))
    short = {"model": "fake", "messages": MSG, "max_tokens": 8}
    long = {"model": "fake", "messages": MSG, "stream": True}
    try:
        asyncio.run(bench_pair("fake upstream", fake, velo, args.requests, short, long, 5, 4, "pieces/s"))
    finally:
        for p in procs:
            p.terminate()
    if args.skip_llama:
        return

    llama = chat_server(Path(tempfile.mkdtemp())).start()
    velo_port = free_port()
    velo_proc = _spawn(_run_velo, velo_port, "llamacpp", llama.url)
    velo = f"http://127.0.0.1:{velo_port}"
    short = {"model": "m", "messages": MSG, "max_tokens": 8, "temperature": 0}
    long = {"model": "m", "messages": STORY, "max_tokens": args.llama_tokens, "temperature": 0, "stream": True}
    try:
        asyncio.run(bench_pair("llama-server", llama.url, velo, args.llama_requests, short, long, 6, 1, "tok/s"))
    finally:
        velo_proc.terminate()
        llama.stop()


if __name__ == "__main__":
    main()
