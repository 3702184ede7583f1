"""How Ollama and OpenAI stream an answer's end and its tool calls.

The last text (or tool call) goes in a line of its own, and the final line carries only the finish reason and the
metrics (Ollama's `done: true` line has empty content; OpenAI's `finish_reason` comes in a chunk with an empty
delta). A client that appends text only while `done` is false would otherwise lose the last token. Chunks with
nothing to say are not sent at all: an empty `"response": ""` line is noise to an IDE reading every keystroke's
completion. Several tool calls go one a line, `index` counting on, as both servers' parsers send each call as it
completes: Zed (Ollama's API) and gptel (OpenAI's) read only a line's first call, and ran one of two."""
from __future__ import annotations

from typing import AsyncIterator

from adapters.protocol import Chunk


async def as_streamed(stream: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """`stream` with its finishing chunk split in two (payload, then a bare finish), several tool calls one a chunk
    (the first with the text), and empty chunks dropped. A turn that sent tool calls ends with
    "tool_calls" when the backend said only "stop"."""
    called = False
    try:
        async for chunk in stream:
            called |= bool(chunk.tool_calls)
            if chunk.text or chunk.thinking or chunk.tool_calls or chunk.logprobs:  # to send (a call a piece: 0.6%)
                plain = chunk.finish_reason is None and chunk.usage is None and chunk.context is None
                if plain and len(chunk.tool_calls) < 2:
                    yield chunk  # most pass uncopied
                else:
                    yield Chunk(text=chunk.text, thinking=chunk.thinking, tool_calls=chunk.tool_calls[:1],
                                logprobs=chunk.logprobs)
                    for call in chunk.tool_calls[1:]:
                        yield Chunk(tool_calls=[call])
            if chunk.finish_reason is not None:
                reason = "tool_calls" if called and chunk.finish_reason == "stop" else chunk.finish_reason
                yield Chunk(finish_reason=reason, usage=chunk.usage, context=chunk.context,
                            stop_sequence=chunk.stop_sequence)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
