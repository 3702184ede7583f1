"""What one very large request does to every other client: a 28 MB history (100,000 messages; a 26 MB prompt for
`/api/generate`) sent in each dialect while a small Ollama chat asks every 5 ms, the longest gap between the small
client's answers. Baseline, same run: the same tree with its large-body threshold (`proxy/http_io.py`
`_PARSE_APART_BYTES`) out of reach, so the body's JSON, its dialect's parse, the cache's and coalescing's keys and
the Responses items are worked out on the event loop, as before this stop.

Velo runs over the scripted backend, in a process of its own, with the request greedy (so the cache and coalescing
key it) and the backend taking the whole history as Ollama does (no trimming); the fake counts no tokens (a real
backend counts elsewhere). orjson holds the GIL while it parses on its thread: that share stays a stall either way.

    python bench/large_body.py [--rounds 2] [--messages 100000]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.llama_server import free_port  # noqa: E402

SMALL = json.dumps({"model": "tiny", "stream": False, "messages": [{"role": "user", "content": "hi"}],
                    "options": {"temperature": 0.7}}).encode()
JSON = {"Content-Type": "application/json"}


def _text(i: int) -> str:
    return f"message {i}: " + "lorem ipsum dolor sit amet " * 9


def _bodies(n: int) -> dict[str, tuple[str, bytes]]:
    msgs = [{"role": ("user", "assistant")[i % 2], "content": _text(i)} for i in range(n)]
    greedy = {"model": "tiny", "temperature": 0}
    return {name: (path, json.dumps(body).encode()) for name, path, body in (
        ("anthropic", "/v1/messages", {**greedy, "max_tokens": 5, "messages": msgs}),
        ("openai", "/v1/chat/completions", {**greedy, "max_tokens": 5, "messages": msgs}),
        ("responses", "/v1/responses", {**greedy, "max_output_tokens": 16, "input": msgs}),
        ("ollama chat", "/api/chat", {"model": "tiny", "stream": False, "messages": msgs,
                                      "options": {"temperature": 0}}),
        ("ollama generate", "/api/generate", {"model": "tiny", "stream": False, "options": {"temperature": 0},
                                              "prompt": "".join(_text(i) for i in range(n))}))}


def _serve(port: int, inline: bool) -> None:
    """Velo over the scripted backend on `port`; `inline`: every body worked out on the event loop."""
    from aiohttp import web

    from proxy import http_io
    from proxy.app import make_app
    from proxy.config import Config
    from tests.scripted import ScriptedBackend

    async def no_count(self, req):  # noqa: ANN001 - the fake's own count is a str.split over 28 MB
        return None
    ScriptedBackend.count_tokens = no_count
    ScriptedBackend.fits_context = True
    if inline:
        http_io._PARSE_APART_BYTES = 1 << 62
    web.run_app(make_app(Config(), {"scripted": ScriptedBackend()}), host="127.0.0.1", port=port,
                print=lambda *_: print("up", flush=True), handle_signals=True)


async def _longest_gap(url: str, path: str, raw: bytes) -> float:
    """The longest time between two answers of the small client while the large request is answered, in ms."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def small(session: aiohttp.ClientSession) -> None:
        last = time.perf_counter()
        while not done.is_set():
            async with session.post(url + "/api/chat", data=SMALL, headers=JSON) as resp:
                await resp.read()
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            await asyncio.sleep(0.005)
    async with aiohttp.ClientSession() as session, aiohttp.ClientSession() as big:
        for _ in range(20):
            async with session.post(url + "/api/chat", data=SMALL, headers=JSON) as resp:
                await resp.read()
        asker = asyncio.create_task(small(session))
        await asyncio.sleep(0.2)
        gaps.clear()
        async with big.post(url + path, data=raw, headers=JSON) as resp:
            assert resp.status == 200, (path, resp.status, (await resp.read())[:200])
            await resp.read()
        await asyncio.sleep(0.1)
        done.set()
        await asker
    return max(gaps) * 1000


def _measure(inline: bool, bodies: dict[str, tuple[str, bytes]], rounds: int) -> dict[str, list[float]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)] + (["--inline"] if inline else []),
                            cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
        url = f"http://127.0.0.1:{port}"
        return {name: [asyncio.run(_longest_gap(url, path, raw)) for _ in range(rounds)]
                for name, (path, raw) in bodies.items()}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--inline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return _serve(args.serve, args.inline)
    bodies = _bodies(args.messages)
    apart, inline = _measure(False, bodies, args.rounds), _measure(True, bodies, args.rounds)
    for name, (_, raw) in bodies.items():
        a, b = statistics.median(apart[name]), statistics.median(inline[name])
        print(f"{name:16s} {len(raw) / 1e6:5.1f} MB  longest gap of a small client: {a:7.1f} ms against "
              f"{b:7.1f} ms on the loop ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
