"""What the response cache's key costs a request (proxy/cache/keys.py: the exact key, which the semantic scope and
coalescing share), and what a miss costs the cache in all (the lookup in memory and the store of a 3-chunk answer,
exact tier only), against the parse of that same request by the OpenAI dialect in the same run: a 13-turn chat
with 4 tools and a tool call answered, as an agent sends it each turn. With `--trees`, the same figures for other
checkouts (a worktree of an earlier commit), each measured in its own process, the trees interleaved by round.

    python bench/cache_keys.py [--reps 3000] [--rounds 5] [--trees PATH ...]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["path"]}}} for i in range(4)]
BODY = {"model": "m", "temperature": 0, "tools": TOOLS,
        "messages": [{"role": "system", "content": "You are a careful coding agent."}]
        + [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 20} for i in range(10)]
        + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_a", "type": "function", "function": {
            "name": "tool_0", "arguments": "{\"path\": \"a.py\"}"}}]},
           {"role": "tool", "tool_call_id": "call_a", "content": "print('hi')"}]}


def one_round(reps: int) -> tuple[float, float, float]:
    """(the parse, the key, a miss) in microseconds a request, in this process's checkout."""
    from adapters.protocol import Chunk, Usage
    from proxy.cache import CacheConfig, CacheLayer
    from proxy.cache.keys import exact_key
    from proxy.dialects import openai

    def per_call_us(fn) -> float:
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - start) / reps * 1e6
    req = openai.parse_chat(BODY)
    answer = [Chunk("Hel"), Chunk("lo"), Chunk(finish_reason="stop", usage=Usage(3, 2))]

    async def misses() -> float:
        layer = await CacheLayer.create(CacheConfig())
        asks = [dataclasses.replace(req, model=f"m{i}") for i in range(reps)]  # each a miss
        start = time.perf_counter()
        for ask in asks:
            if hasattr(layer, "asked"):
                asked = layer.asked(ask, "tenant")
                await layer.lookup(asked)
                await layer.store(asked, answer)
            else:  # a checkout whose lookup and store each took the request itself
                await layer.lookup(ask, "tenant", False)
                await layer.store(ask, "tenant", answer)
        return (time.perf_counter() - start) / reps * 1e6
    return (per_call_us(lambda: openai.parse_chat(BODY)), per_call_us(lambda: exact_key(req, "tenant")),
            asyncio.run(misses()))


def measured(tree: str, reps: int) -> tuple[float, float, float]:
    out = subprocess.run([sys.executable, __file__, "--one", "--reps", str(reps)], cwd=tree, check=True,
                         env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True).stdout
    return tuple(json.loads(out.splitlines()[-1]))  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trees", nargs="*", default=[])
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one_round(a.reps)))
        return
    trees = [HERE, *a.trees]
    rows: dict[str, list[tuple[float, float, float]]] = {t: [] for t in trees}
    for r in range(a.rounds):
        for tree in trees:
            parse, key, miss = measured(tree, a.reps)
            rows[tree].append((parse, key, miss))
            print(f"round {r} {os.path.abspath(tree):30} parse {parse:6.1f} us   key {key:6.1f} us "
                  f"({key / parse:4.2f}x the parse)   miss {miss:6.1f} us ({miss / parse:4.2f}x)", flush=True)
    _, ours_key, ours_miss = (statistics.median(x[i] for x in rows[HERE]) for i in range(3))
    for tree in trees:
        parse, key, miss = (statistics.median(x[i] for x in rows[tree]) for i in range(3))
        against = "" if tree == HERE else f"; this checkout's {ours_key / key:.2f}x and {ours_miss / miss:.2f}x of them"
        print(f"median {os.path.abspath(tree)}: key {key:.1f} us, {key / parse:.2f}x the request's parse; a miss "
              f"{miss:.1f} us, {miss / parse:.2f}x{against}")


if __name__ == "__main__":
    main()
