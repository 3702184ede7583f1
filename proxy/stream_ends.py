"""How Ollama and OpenAI end a stream: the last text (or tool call) goes in a line of its own, and the final line
carries only the finish reason and the metrics (Ollama's `done: true` line has empty content; OpenAI's
`finish_reason` comes in a chunk with an empty delta). A client that appends text only while `done` is false would
otherwise lose the last token. Chunks with nothing to say are not sent at all: an empty `"response": ""` line is
noise to an IDE reading every keystroke's completion."""
from __future__ import annotations

from typing import AsyncIterator

from adapters.protocol import Chunk


def has_payload(chunk: Chunk) -> bool:
    return bool(chunk.text or chunk.thinking or chunk.tool_calls or chunk.logprobs)


async def separate_finish(stream: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """`stream` with its finishing chunk split in two (payload, then a bare finish) and empty chunks dropped. A
    turn that sent tool calls ends with "tool_calls" when the backend said only "stop"."""
    called = False
    try:
        async for chunk in stream:
            called |= bool(chunk.tool_calls)
            if has_payload(chunk):
                plain = chunk.finish_reason is None and chunk.usage is None and chunk.context is None
                yield chunk if plain else Chunk(text=chunk.text, thinking=chunk.thinking,  # most pass uncopied
                                                tool_calls=chunk.tool_calls, logprobs=chunk.logprobs)
            if chunk.finish_reason is not None:
                reason = "tool_calls" if called and chunk.finish_reason == "stop" else chunk.finish_reason
                yield Chunk(finish_reason=reason, usage=chunk.usage, context=chunk.context,
                            stop_sequence=chunk.stop_sequence)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
