"""What the check of a structured-output schema (adapters/output_format.py) adds to a request that carries one,
against the parse of that same request by the OpenAI dialect, in the same run: the check compiles the schema as
the engine does (llguidance) the first time a schema comes (`new`: each call another schema), and finds its verdict
kept after that (`again`: the same schema, as a client sends it with each request). A request without a schema
pays one isinstance test. And a large schema (268 KB, never kept), compiled on a worker thread: the longest the
event loop waits meanwhile, against the compile's own time on the loop.

    python bench/schema_check.py [--reps 2000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from adapters.output_format import check_format  # noqa: E402
from engine.grammar import grammar_for  # noqa: E402
from proxy.dialects import openai  # noqa: E402
from tests.loop_watch import loop_gaps  # noqa: E402

# A form an agent fills: a few typed fields, an enum, a nested list of objects.
SCHEMA = {"type": "object", "required": ["name", "age", "tags", "address"], "properties": {
    "name": {"type": "string", "minLength": 1}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "role": {"type": "string", "enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}}}}
BODY = {"model": "m", "messages": [{"role": "system", "content": "Extract the person."},
                                   {"role": "user", "content": "Ada, 36, admin, lives in London (N1 9GU). " * 8}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}


def per_call_us(fn, reps: int) -> float:
    start = time.perf_counter()
    for i in range(reps):
        fn(i)
    return (time.perf_counter() - start) / reps * 1e6


async def awaited_us(fn, reps: int) -> float:
    start = time.perf_counter()
    for i in range(reps):
        await fn(i)
    return (time.perf_counter() - start) / reps * 1e6


def large_schema(salt: int) -> dict:
    """512 objects of 8 enums each: 268 KB of JSON, past what is kept."""
    return {"type": "object", "description": str(salt), "properties": {f"p{i}": {"type": "object", "properties": {
        f"q{j}": {"type": "string", "enum": [f"v{k}" for k in range(4)]} for j in range(8)}} for i in range(512)}}


async def loop_held_ms(schema: dict) -> float:
    """The longest the event loop waited while `schema` was checked."""
    _, gaps = await loop_gaps(check_format(schema), every=0.001)
    return max(gaps) * 1000


async def rounds(a: argparse.Namespace) -> None:
    parsed = openai.parse_chat(BODY)
    assert parsed.format == SCHEMA
    rows, seen = [], iter(range(10**9))
    for r in range(a.rounds):  # interleaved: the machine's noise falls on all alike
        parse = per_call_us(lambda i: openai.parse_chat(BODY), a.reps)
        new = await awaited_us(lambda i: check_format({**SCHEMA, "description": str(next(seen))}), a.reps // 10)
        again = await awaited_us(lambda i: check_format(parsed.format), a.reps)
        none = await awaited_us(lambda i: check_format(None), a.reps)
        started = time.perf_counter()
        grammar_for(large_schema(-r))
        compile_ms = (time.perf_counter() - started) * 1000
        held = await loop_held_ms(large_schema(r))
        rows.append((parse, new, again, none, compile_ms, held))
        print(f"parse {parse:6.1f} us   check: new schema {new:6.1f} us ({new / parse:5.2f}x)   "
              f"again {again:5.2f} us ({again / parse:4.2f}x)   no schema {none:5.2f} us   "
              f"268 KB schema: compiled in {compile_ms:.0f} ms, the loop held {held:.1f} ms", flush=True)
    parse, new, again, none, compile_ms, held = (statistics.median(r[i] for r in rows) for i in range(6))
    print(f"median against the request's parse ({parse:.1f} us): a new schema {new / parse:.1f}x ({new:.0f} us), "
          f"the same again {again / parse:.2f}x ({again:.1f} us), no schema {none / parse:.3f}x; a 268 KB schema "
          f"held the loop {held:.1f} ms, {held / compile_ms:.2f}x of its compile ({compile_ms:.0f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    asyncio.run(rounds(ap.parse_args()))


if __name__ == "__main__":
    main()
