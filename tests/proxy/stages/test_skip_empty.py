"""A stream's chunks with nothing to send stop in the pipeline, so its first byte is its first content."""
from __future__ import annotations

from typing import AsyncIterator

from adapters.protocol import ChatRequest, Chunk, Usage
from proxy.job import Job
from proxy.stages.skip_empty import SkipEmpty


async def _chunks(*chunks: Chunk) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def test_only_chunks_with_something_in_them_go_on() -> None:
    job = Job(ChatRequest(model="m", messages=[], stream=True))
    rest = _chunks(Chunk(), Chunk(text="a"), Chunk(), Chunk(thinking="t"),
                   Chunk(finish_reason="stop", usage=Usage(completion_tokens=2)))
    sent = [c async for c in SkipEmpty(None)(job, lambda _: rest)]  # type: ignore[arg-type] - it uses no services
    assert [(c.text, c.thinking, c.finish_reason) for c in sent] == [("a", "", None), ("", "t", None),
                                                                      ("", "", "stop")]


def test_a_one_answer_request_passes_it_by() -> None:
    stage = SkipEmpty(None)  # type: ignore[arg-type]
    assert stage.wraps(Job(ChatRequest(model="m", messages=[], stream=True)))
    assert not stage.wraps(Job(ChatRequest(model="m", messages=[], stream=False)))
