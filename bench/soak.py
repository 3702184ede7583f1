"""A bounded soak: 20,000 mixed requests through one Velo process at concurrency 64, then its figures.

The mix, drawn from a seeded random generator: every dialect (Ollama chat and generate, OpenAI chat and
completions, Anthropic Messages, OpenAI Responses), streamed and not; repeated temperature-0 questions that the
response cache answers; tools offered (the repair path); embeddings; model names nobody serves (404); and hostile
bodies: invalid JSON, nesting 1,000 levels deep, a 10 GB declared Content-Length, fields of the wrong type (400 or
413). Upstreams are tests/fakes.py's FakeOpenAI and OllamaDouble, fast, in a process of their own; Velo runs in
its own process (`proxy.cli.serve`), measured there: RSS and open file descriptors at the start (after a warm-up),
the middle and the end.

Printed: requests per second, latency p50/p99 (whole answers read), answers by status, and which statuses were
not expected for their request (the goal: none, and no 5xx), and RSS/FDs at the three points (start and end
measured idle, 10 s after the clients closed their connections; the middle under load).

    python bench/soak.py [--requests 20000] [--concurrency 64] [--seed 7]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.http_ready import wait_until_ok  # noqa: E402
from tests.llama_server import free_port  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _run_upstreams(urls: multiprocessing.Queue) -> None:
    from tests.fakes import FakeOpenAI, OllamaDouble

    async def run() -> None:
        async with FakeOpenAI(models=["fake"]) as oai, OllamaDouble(models=["llama:latest"]) as oll:
            oai.script.reply = oll.script.reply = " ".join(["word"] * 24)
            urls.put((oai.url, oll.url))
            await asyncio.Event().wait()
    asyncio.run(run())


def _run_velo(port: int, oai: str, oll: str) -> None:
    import logging

    from adapters.base import BackendConfig
    from proxy.cli import run_server, serve
    from proxy.config import Config, ServerConfig

    logging.basicConfig(level=logging.ERROR)
    cfg = Config(server=ServerConfig(port=port, max_body_bytes=1024 * 1024),
                 backends=[BackendConfig(name="oai", kind="openai", urls=[oai]),
                           BackendConfig(name="oll", kind="ollama", urls=[oll])])
    run_server(serve(cfg))


def _spawn(target: Any, *args: Any) -> multiprocessing.Process:
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def usage(pid: int) -> tuple[float, int]:
    """RSS in MB and open file descriptors of process `pid`."""
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * resource.getpagesize() / 2**20
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


Request = tuple[str, str, bytes | None, dict[str, str], set[int]]  # kind, path, body, headers, expected statuses


def draw(rng: random.Random) -> Request:
    """One request of the mix, with the statuses it may get."""
    json_ = {"Content-Type": "application/json"}
    stream = rng.random() < 0.5
    model = rng.choice(["fake", "llama"])
    question = [{"role": "user", "content": f"question {rng.randrange(40)}"}]
    roll = rng.random()
    if roll < 0.12:
        return "ollama chat", "/api/chat", orjson.dumps({"model": model, "messages": question, "stream": stream,
                                                         "options": {"temperature": 0}}), json_, {200}
    if roll < 0.20:
        return "ollama generate", "/api/generate", orjson.dumps({"model": model, "prompt": "def f(",
                                                                 "stream": stream}), json_, {200}
    if roll < 0.34:
        return "openai chat", "/v1/chat/completions", orjson.dumps({"model": model, "messages": question,
                                                                    "stream": stream, "temperature": 0}), json_, {200}
    if roll < 0.40:
        return "openai completions", "/v1/completions", orjson.dumps({"model": model, "prompt": "2+2=",
                                                                      "stream": stream}), json_, {200}
    if roll < 0.52:
        return "anthropic", "/v1/messages", orjson.dumps({"model": model, "max_tokens": 64, "messages": question,
                                                          "stream": stream}), json_, {200}
    if roll < 0.64:
        return "responses", "/v1/responses", orjson.dumps({"model": model, "input": "hi", "stream": stream,
                                                           "store": rng.random() < 0.2}), json_, {200}
    if roll < 0.72:
        return "tools (repair)", "/v1/chat/completions", orjson.dumps(
            {"model": model, "messages": MESSAGES, "tools": [TOOL], "stream": stream}), json_, {200}
    if roll < 0.78:
        return "embeddings", rng.choice(["/api/embed", "/v1/embeddings"]), orjson.dumps(
            {"model": model, "input": ["a", "b"]}), json_, {200}
    if roll < 0.88:
        path = rng.choice(["/api/chat", "/v1/chat/completions", "/v1/messages", "/v1/responses"])
        return "unknown model", path, orjson.dumps({"model": f"nobody-{rng.randrange(10**9)}",
                                                    "messages": MESSAGES, "input": "hi", "max_tokens": 8}), json_, {404}
    return hostile(rng)


def hostile(rng: random.Random) -> Request:
    json_ = {"Content-Type": "application/json"}
    kind = rng.randrange(5)
    if kind == 0:
        return "hostile: invalid JSON", "/api/chat", b'{"model": "fake", "messages": [', json_, {400}
    if kind == 1:
        deep = b"[" * 1000 + b"1" + b"]" * 1000
        return ("hostile: 1,000 levels", "/v1/chat/completions",
                b'{"model": "fake", "messages": [{"role": "user", "content": "x"}], "tools": ' + deep + b"}", json_,
                {400})
    if kind == 2:
        return "hostile: 10 GB declared", "/v1/messages", None, {**json_, "Content-Length": "10000000000"}, {413}
    if kind == 3:
        return "hostile: wrong types", "/v1/chat/completions", orjson.dumps(
            {"model": "fake", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
             "response_format": {"type": "json_schema", "json_schema": "x"}}), json_, {400}
    return "hostile: seed 2^64-1, n=3", "/v1/chat/completions", orjson.dumps(
        {"model": "fake", "messages": MESSAGES, "seed": 2**64 - 1, "n": 3}), json_, {200}


async def one(session: aiohttp.ClientSession, base: str, req: Request) -> tuple[str, int, float, bool]:
    kind, path, body, headers, expected = req
    started = time.perf_counter()
    try:
        if body is None:  # a declared body that never comes: only the answer's head is read
            reader, writer = await asyncio.open_connection(*base.removeprefix("http://").split(":"))
            writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10000000000\r\n\r\n"
                         .encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            writer.close()
            status = int(head.split()[1])
        else:
            async with session.post(base + path, data=body, headers=headers) as resp:
                await resp.read()
                status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
        status = 0
    return kind, status, time.perf_counter() - started, status in expected


async def quiet_usage(pid: int) -> tuple[float, int]:
    """RSS and FDs once idle kept-alive connections have closed (Velo keeps upstream ones 4 s; aiohttp's pool
    sweeps them on its own clock, up to twice that)."""
    await asyncio.sleep(10)
    return usage(pid)


async def soak(base: str, pid: int, total: int, concurrency: int, seed: int) -> None:
    rng = random.Random(seed)
    requests = [draw(rng) for _ in range(total)]
    samples: list[tuple[str, float, int]] = []
    async with aiohttp.ClientSession() as session:
        for req in requests[:200]:  # warm-up: the cache and the pools, not counted
            await one(session, base, req)
    samples.append(("start", *await quiet_usage(pid)))
    gate = asyncio.Semaphore(concurrency)
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def limited(req: Request) -> tuple[str, int, float, bool]:
            nonlocal done
            async with gate:
                out = await one(session, base, req)
            done += 1
            if done == total // 2:
                samples.append(("middle (under load)", *usage(pid)))
            return out
        started = time.perf_counter()
        results = await asyncio.gather(*(limited(r) for r in requests))
        elapsed = time.perf_counter() - started
    samples.append(("end", *await quiet_usage(pid)))
    report(results, elapsed, samples)


def report(results: list[tuple[str, int, float, bool]], elapsed: float, samples: list[tuple[str, float, int]]) -> None:
    latencies = [r[2] * 1000 for r in results]
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    print(f"{len(results)} requests in {elapsed:.1f} s: {len(results) / elapsed:.0f} req/s; "
          f"latency p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms")
    print("answers by status: " + ", ".join(f"{s or 'no answer'}: {n}" for s, n in
                                            sorted(collections.Counter(r[1] for r in results).items())))
    unexpected = collections.Counter((r[0], r[1]) for r in results if not r[3])
    fivexx = sum(n for (_, s), n in unexpected.items() if s >= 500 or s == 0)
    print(f"unexpected answers: {sum(unexpected.values())} ({fivexx} 5xx or none)" +
          "".join(f"\n  {kind}: {status} x{n}" for (kind, status), n in sorted(unexpected.items())))
    by_kind = collections.Counter(r[0] for r in results)
    print("mix: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))
    print("Velo process   " + "   ".join(f"{name}: RSS {rss:.0f} MB, {fds} FDs" for name, rss, fds in samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    urls: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
    upstreams = _spawn(_run_upstreams, urls)
    oai, oll = urls.get(timeout=60)
    port = free_port()
    velo = _spawn(_run_velo, port, oai, oll)
    base = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_until_ok(base + "/health", 60))
        asyncio.run(soak(base, velo.pid, args.requests, args.concurrency, args.seed))
    finally:
        for proc in (velo, upstreams):
            proc.terminate()
            proc.join(10)


if __name__ == "__main__":
    main()
