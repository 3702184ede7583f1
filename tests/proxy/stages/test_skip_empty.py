"""A stream's chunks with nothing to send stop in the pipeline, so its first byte is its first content."""
from __future__ import annotations

from typing import AsyncIterator

from adapters.protocol import Chunk, Usage
from proxy.stages.skip_empty import _with_content


async def _chunks(*chunks: Chunk) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def test_only_chunks_with_something_in_them_go_on() -> None:
    sent = [c async for c in _with_content(_chunks(Chunk(), Chunk(text="a"), Chunk(), Chunk(thinking="t"),
                                                   Chunk(finish_reason="stop", usage=Usage(completion_tokens=2))))]
    assert [(c.text, c.thinking, c.finish_reason) for c in sent] == [("a", "", None), ("", "t", None),
                                                                      ("", "", "stop")]
