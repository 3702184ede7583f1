"""Long answers in small pieces, where a string grown at every piece is quadratic and holds the event loop (every
other request waits):
- one very long streamed event (a file-sized tool call's arguments in one SSE `data:` line, sent in 16 KiB pieces
  as a backend writes it): Velo's line reader (`Upstream.lines`) against reading the same bytes raw
  (`Upstream.reads`), same server, same run, alternated;
- a tool call streamed as 16-character argument deltas (vLLM, llama-server) through the OpenAI wire's parser,
  against the same deltas as text, which it passes on;
- an answer in 16-character chunks through the Responses dialect's stream writer, its cost a chunk at 2 MB
  against at 128 KB (1x: linear).

    python bench/long_event.py [--mib 4 16 32] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.base import BackendConfig  # noqa: E402
from adapters.http import Upstream  # noqa: E402
from adapters.openai_wire import ChatStream  # noqa: E402
from adapters.protocol import Chunk  # noqa: E402
from proxy.dialects.responses import parse_request  # noqa: E402
from proxy.dialects.responses_stream import ResponseStream  # noqa: E402

PIECE = 16 * 1024


async def serve(size: int) -> asyncio.Server:
    """Answers every request with one SSE event of `size` bytes of arguments, chunked, a piece per write."""
    event = b"data: " + orjson.dumps({"arguments": "x" * size}) + b"\n\n"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(event), PIECE):
                piece = event[i:i + PIECE]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                await asyncio.sleep(0)  # a piece at a time, as a backend that writes while it generates
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def timed(up: Upstream, by_lines: bool) -> float:
    started = time.perf_counter()
    async with up.request("POST", "/v1/chat/completions", {}, wait=60) as resp:
        if by_lines:
            async for _ in up.lines(resp, first_wait=60, total=None):
                pass
        else:
            async for _ in up.reads(resp, 60, None):
                pass
    return time.perf_counter() - started


def deltas(size: int, as_arguments: bool) -> float:
    """Seconds to parse `size` bytes of deltas of 16 characters: a call's arguments, or text."""
    parser, piece = ChatStream(), "x" * 16
    started = time.perf_counter()
    parser.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                                     "function": {"name": "write",
                                                                                  "arguments": '{"a": "'}}]}}]})
    for _ in range(size // 16):
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if as_arguments else \
            {"content": piece}
        parser.feed({"choices": [{"index": 0, "delta": delta}]})
    parser.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]},
                              "finish_reason": "tool_calls"}]})
    parser.last()
    return time.perf_counter() - started


def responses_writer(size: int) -> float:
    """Seconds a 16-character chunk, for an answer of `size` bytes through the Responses stream writer."""
    writer = ResponseStream("resp_1", parse_request({"model": "m", "input": "hi", "stream": True}))
    chunk, n = Chunk(text="x" * 16), size // 16
    started = time.perf_counter()
    for _ in range(n):
        writer.encode(chunk)
    writer.encode(Chunk(finish_reason="stop"))
    return (time.perf_counter() - started) / n


async def main(sizes: list[int], rounds: int) -> None:
    print(f"{'event':>8}  {'lines (s)':>10}  {'raw reads (s)':>13}  ratio")
    for mib in sizes:
        server = await serve(mib << 20)
        port = server.sockets[0].getsockname()[1]
        up = Upstream(BackendConfig(name="b", kind="openai", urls=[f"http://127.0.0.1:{port}"]))
        lines, raw = [], []
        for _ in range(rounds):
            lines.append(await timed(up, True))
            raw.append(await timed(up, False))
        await up.close()
        server.close()
        line_s, raw_s = statistics.median(lines), statistics.median(raw)
        print(f"{mib:>4} MiB  {line_s:>10.3f}  {raw_s:>13.3f}  {line_s / raw_s:.2f}x")
    calls = [deltas(1 << 20, True) for _ in range(rounds)]
    texts = [deltas(1 << 20, False) for _ in range(rounds)]
    call_s, text_s = statistics.median(calls), statistics.median(texts)
    print(f"1 MiB of tool-call arguments in 16-character deltas: {call_s:.3f} s, the same deltas as text "
          f"{text_s:.3f} s: {call_s / text_s:.2f}x")
    small = statistics.median(responses_writer(128 << 10) for _ in range(rounds))
    large = statistics.median(responses_writer(2 << 20) for _ in range(rounds))
    print(f"Responses stream writer, a 16-character chunk: {large * 1e6:.1f} us at 2 MiB, {small * 1e6:.1f} us at "
          f"128 KiB: {large / small:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.mib, args.rounds))
