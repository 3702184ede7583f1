"""What a long `previous_response_id` chain costs the Responses store (proxy/responses_store.py), as a Codex-style
agent session with `store: true` makes it: `--turns` turns, each sending one tool output of `--output` bytes and
answered by one short message. Baseline, same run: the layout before responses were linked, each keeping a copy of
the whole conversation before it (a row with `history`, which the store still reads).
- bytes stored for the chain (encoded, as SQLite and Redis hold them; and what the in-process tier counts);
- how many of the chain's responses the default `[responses] max_bytes` keeps;
- the time to rebuild the conversation the next turn continues (median of `--rounds`): the linked layout walks the
  chain back, the baseline reads one row; with `--redis URL`, also with the store on that Redis, whose copies held
  in this process are checked against it.

    python bench/responses_chain.py [--turns 200] [--output 4096] [--rounds 20] [--redis redis://127.0.0.1:6379/0]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.exact_json import dumps  # noqa: E402
from proxy.dialects.responses import stored_item  # noqa: E402
from proxy.responses_store import ResponsesConfig, ResponseStore, StoredResponse  # noqa: E402

TENANT = f"bench-{uuid.uuid4().hex}"  # apart from whatever else a shared Redis holds


def _turn(n: int, size: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Turn `n`'s response object and its input items, as the routes store them."""
    sent = {"type": "function_call_output", "call_id": f"call_{n}", "output": "x" * size} if n else \
        {"type": "message", "role": "user", "content": "Fix the failing test."}
    said = {"id": f"msg_{n}", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Reading the next file.", "annotations": []}]}
    return {"id": f"resp_{n}", "object": "response", "status": "completed", "output": [said]}, [stored_item(sent)]


async def _chain(turns: int, size: int, linked: bool, max_bytes: int,
                 redis_url: str | None = None) -> tuple[ResponseStore, list[str]]:
    store = await ResponseStore.open(ResponsesConfig(max_bytes=max_bytes, redis_url=redis_url))
    conversation: list[dict[str, Any]] = []
    for n in range(turns):
        response, sent = _turn(n, size)
        previous = f"resp_{n - 1}" if n else None
        record = StoredResponse(response, sent, previous) if linked else \
            StoredResponse(response, sent, history=list(conversation))
        await store.put(TENANT, record)
        conversation += sent + response["output"]
    return store, [f"resp_{n}" for n in range(turns)]


async def _rebuild(store: ResponseStore, last: str, args: argparse.Namespace) -> float:
    """Median seconds to rebuild the conversation that continues `last`."""
    record = await store.get(TENANT, last)
    assert record is not None
    times = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        items = await store.conversation(TENANT, record)
        times.append(time.perf_counter() - start)
    assert len(items) == 2 * args.turns
    return statistics.median(times)


async def _measure(args: argparse.Namespace, linked: bool) -> dict[str, float]:
    store, ids = await _chain(args.turns, args.output, linked, 1 << 40)
    records = [await store.get(TENANT, resp_id) for resp_id in ids]
    encoded = sum(len(dumps(record.__dict__)) for record in records if record is not None)
    seen = {"encoded": encoded, "held": store.memory.bytes_used, "rebuild": await _rebuild(store, ids[-1], args)}
    bounded, ids = await _chain(args.turns, args.output, linked, ResponsesConfig().max_bytes)
    seen["kept"] = sum([await bounded.get(TENANT, resp_id) is not None for resp_id in ids])
    if args.redis:
        shared, ids = await _chain(args.turns, args.output, linked, 1 << 40, args.redis)
        seen["redis"] = await _rebuild(shared, ids[-1], args)
        for resp_id in ids:
            await shared.delete(TENANT, resp_id)
        await shared.close()
    return seen


async def main(args: argparse.Namespace) -> None:
    old, new = await _measure(args, linked=False), await _measure(args, linked=True)
    print(f"{args.turns} turns, {args.output}-byte tool outputs; baseline: each response holding the conversation "
          f"before it, same run")
    print(f"bytes stored: {new['encoded'] / 1e6:.2f} MB against {old['encoded'] / 1e6:.2f} MB "
          f"({new['encoded'] / old['encoded']:.4f}x); held in memory {new['held'] / 1e6:.2f} MB against "
          f"{old['held'] / 1e6:.2f} MB ({new['held'] / old['held']:.4f}x)")
    print(f"responses kept under the default max_bytes ({ResponsesConfig().max_bytes >> 20} MiB): "
          f"{new['kept']} of {args.turns} against {old['kept']}")
    print(f"rebuilding the conversation ({args.rounds} rounds, median): {new['rebuild'] * 1e3:.3f} ms against "
          f"{old['rebuild'] * 1e3:.3f} ms ({new['rebuild'] / old['rebuild']:.1f}x)")
    if args.redis:
        print(f"... with the store on Redis: {new['redis'] * 1e3:.3f} ms against {old['redis'] * 1e3:.3f} ms "
              f"({new['redis'] / old['redis']:.1f}x)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--output", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--redis", help="a Redis URL: rebuild times with the store on it too")
    asyncio.run(main(p.parse_args()))
