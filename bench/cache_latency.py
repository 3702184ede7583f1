"""Cache latency through the proxy, in one run: a miss against a fast upstream, an exact hit, a semantic hit.

Velo runs on a loopback port in front of the fake OpenAI-compatible upstream of tests/fakes.py (answers at once,
over real HTTP, through the real openai adapter). A client sends non-streaming OpenAI chat requests at
temperature 0, one at a time:
- misses: N distinct questions (each then stored),
- exact hits: the same N questions again,
- semantic hits: the QQP `similar` questions whose `origin` was asked before (only answers marked
  `X-Velo-Cache: semantic` count), on two more Velos with the semantic tier on, one per embedding precision
  (int8, the default, and float32), asked in turn so both see the same noise.
Two figures per case: end to end as the client sees it, and inside the proxy (CacheLayer.lookup alone).
Goals: exact hit p99 <= 0.5 ms and semantic hit p99 <= 5 ms inside the proxy.

    python bench/cache_latency.py [--n 300]
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from adapters.base import BackendConfig  # noqa: E402
from proxy.app import make_app  # noqa: E402
from proxy.cache import CacheConfig  # noqa: E402
from proxy.cache.encoders import PRECISIONS  # noqa: E402
from proxy.config import Config  # noqa: E402
from proxy.state import GENERATIONS  # noqa: E402
from proxy.stages.cache import Cache  # noqa: E402
from tests.fakes import FakeOpenAI  # noqa: E402

QQP = Path("/work/shared/data/qqp_similar_pairs.json.gz")


class Velo:
    """One proxy on a loopback port whose cache lookups are timed from inside."""

    def __init__(self, upstream: str, cache: CacheConfig) -> None:
        backend = BackendConfig(name="up", kind="openai", urls=[upstream], models=["fake-gpt"])
        self.app = make_app(Config(backends=[backend], default_backend="up", cache=cache))
        self.lookups: list[tuple[str, float]] = []  # (kind, seconds)
        self.encodes: list[float] = []  # seconds of each forward pass of the embedding model (its own thread)

    async def __aenter__(self) -> "Velo":
        self.runner = web.AppRunner(self.app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        self._time_lookups()
        return self

    def _time_lookups(self) -> None:
        cache = self.app[GENERATIONS].current.pipeline.stage(Cache).layer
        lookup = cache.lookup

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            hit = await lookup(*args, **kwargs)
            self.lookups.append((hit.kind if hit else "miss", time.perf_counter() - started))
            return hit

        cache.lookup = timed
        if cache.embedder is not None:
            encode = cache.embedder.encode

            def timed_encode(texts: list[str]) -> Any:
                started = time.perf_counter()
                vectors = encode(texts)
                self.encodes.append(time.perf_counter() - started)
                return vectors

            cache.embedder.encode = timed_encode

    async def __aexit__(self, *exc: Any) -> None:
        await self.runner.cleanup()


async def ask(session: aiohttp.ClientSession, url: str, question: str) -> tuple[str, float]:
    body = {"model": "fake-gpt", "messages": [{"role": "user", "content": question}], "temperature": 0}
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        assert resp.status == 200, resp.status
        return resp.headers["X-Velo-Cache"], time.perf_counter() - started


def summary(name: str, seconds: list[float]) -> str:
    if not seconds:
        return f"{name:<34} (none)"
    ms = np.array(seconds) * 1000
    return (f"{name:<34} n={len(ms):4d}  p50={np.percentile(ms, 50):7.3f} ms  p99={np.percentile(ms, 99):7.3f} ms"
            f"  max={ms.max():7.3f} ms")


async def run(n: int) -> None:
    pairs = json.loads(gzip.open(QQP).read())[:n]
    async with FakeOpenAI() as upstream, aiohttp.ClientSession() as session:
        async with Velo(upstream.url, CacheConfig()) as exact:
            for q in ["warm-up 1", "warm-up 2", "warm-up 1"]:
                await ask(session, exact.url, q)
            exact.lookups.clear()
            misses = [await ask(session, exact.url, f"question {i}: {p['origin']}") for i, p in enumerate(pairs)]
            hits = [await ask(session, exact.url, f"question {i}: {p['origin']}") for i, p in enumerate(pairs)]
            assert {k for k, _ in misses} == {"miss"} and {k for k, _ in hits} == {"exact"}
            inside = exact.lookups
        async with AsyncExitStack() as stack:  # one Velo per encoder precision, asked in turn (same noise)
            semantic = {p: await stack.enter_async_context(Velo(upstream.url, CacheConfig(semantic=True,
                                                                                           embed_precision=p)))
                        for p in PRECISIONS}
            sem_misses = {p: [] for p in PRECISIONS}
            sem = {p: [] for p in PRECISIONS}
            for pair in pairs:
                for p, velo in semantic.items():
                    sem_misses[p].append(await ask(session, velo.url, pair["origin"]))
            for velo in semantic.values():
                velo.lookups.clear()
                velo.encodes.clear()
            for pair in pairs:
                for p, velo in semantic.items():
                    sem[p].append(await ask(session, velo.url, pair["similar"]))
            threshold = semantic["int8"].app[GENERATIONS].current.pipeline.stage(Cache).layer.cfg.semantic_threshold
    print(f"upstream: fake OpenAI-compatible server over HTTP; {n} questions; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} (other processes share them)")
    print(summary("miss, end to end", [s for _, s in misses]))
    print(summary("exact hit, end to end", [s for _, s in hits]))
    print(summary("exact hit, inside the proxy", [s for k, s in inside if k == "exact"]))
    print(summary("miss lookup, inside the proxy", [s for k, s in inside if k == "miss"]))
    for p, velo in semantic.items():
        print(f"-- semantic tier on, embeddings in {p}")
        print(summary("semantic on: miss (+embed, store)", [s for _, s in sem_misses[p]]))
        print(summary(f"semantic hit, end to end (t={threshold})", [s for k, s in sem[p] if k == "semantic"]))
        print(summary("semantic hit, inside the proxy", [s for k, s in velo.lookups if k == "semantic"]))
        print(summary("semantic miss lookup, inside", [s for k, s in velo.lookups if k == "miss"]))
        print(summary("embedding model, one forward pass", velo.encodes))
    hit_ms = {p: np.array([s for k, s in v.lookups if k == "semantic"]) for p, v in semantic.items()}
    print("semantic hit inside the proxy, int8 / float32: "
          f"p50 {np.percentile(hit_ms['int8'], 50) / np.percentile(hit_ms['float32'], 50):.2f}x, "
          f"p99 {np.percentile(hit_ms['int8'], 99) / np.percentile(hit_ms['float32'], 99):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=300, help="distinct questions per case")
    asyncio.run(run(parser.parse_args().n))


if __name__ == "__main__":
    main()
