"""with_retry against a callable backend: what is re-asked, when it stops, what comes back."""
from __future__ import annotations

from typing import AsyncIterator

import pytest

from adapters.protocol import ChatRequest, Chunk, Message
from proxy.tools.metrics import ModelCounts
from proxy.tools.retry import with_retry
from proxy.tools.structured import StructuredOutputInvalid
from tests.proxy.tools.test_calls import TOOLS


class Backend:
    """Answers the i-th request with answers[i] (the last repeats) and keeps every request."""

    def __init__(self, *answers: str):
        self.answers = answers
        self.requests: list[ChatRequest] = []

    def __call__(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        self.requests.append(req)
        return self._stream(self.answers[min(len(self.requests), len(self.answers)) - 1])

    async def _stream(self, text: str) -> AsyncIterator[Chunk]:
        yield Chunk(text=text)
        yield Chunk(finish_reason="stop")


def _req(**kw) -> ChatRequest:
    return ChatRequest(model="m", messages=[Message("user", "hi")], **kw)


async def _answer(backend: Backend, req: ChatRequest, retries: int, metrics: ModelCounts | None = None,
                  notes: list[str] | None = None) -> list[Chunk]:
    stream = with_retry(backend, req, retries, metrics or ModelCounts(), notes if notes is not None else [])
    return [c async for c in stream]


async def test_structured_output_is_asked_again_with_the_schema_error() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    backend = Backend('{"m": 1}', '{"n": 2}')
    out = await _answer(backend, _req(format=schema), retries=1)
    assert out[-1].text == '{"n": 2}'
    assert '"n" is a required property' in backend.requests[1].messages[-1].content
    assert "JSON only" in backend.requests[1].messages[-1].content


async def test_gives_up_after_max_retries_with_the_last_error() -> None:
    backend, metrics = Backend("not json"), ModelCounts()
    with pytest.raises(StructuredOutputInvalid):
        await _answer(backend, _req(format="json"), retries=2, metrics=metrics)
    assert len(backend.requests) == 3 and metrics.retried == 2


async def test_a_usable_answer_with_an_invalid_call_is_retried_and_kept_if_nothing_better_comes() -> None:
    partly = 'Here: {"name": "get_weather", "arguments": {}}'
    backend, notes = Backend(partly), []
    out = await _answer(backend, _req(tools=TOOLS), retries=1, notes=notes)
    assert "".join(c.text for c in out) == partly and len(backend.requests) == 2
    assert "retry=1" in notes


async def test_retry_names_the_offered_tools() -> None:
    backend = Backend('{"name": "launch", "arguments": {}}', '{"name": "search", "arguments": {"query": "q"}}')
    out = await _answer(backend, _req(tools=TOOLS), retries=1)
    assert [c.name for chunk in out for c in chunk.tool_calls] == ["search"]
    assert "(get_weather, search)" in backend.requests[1].messages[-1].content


async def test_a_valid_first_answer_is_not_retried() -> None:
    backend = Backend('{"name": "search", "arguments": {"query": "q"}}')
    await _answer(backend, _req(tools=TOOLS), retries=3)
    assert len(backend.requests) == 1


async def test_requests_without_tools_or_format_are_not_touched() -> None:
    backend = Backend("plain")
    stream = with_retry(backend, _req(), 3, ModelCounts(), [])
    assert [c.text async for c in stream] == ["plain", ""]


async def test_an_attempt_is_read_whole_before_anything_of_it_goes_up() -> None:
    """With retries on nothing of an attempt is sent before it is checked (the route's heartbeats keep a streaming
    client meanwhile): the checked call alone."""
    out = await _answer(Backend('{"name": "get_weather", "arguments": {"city": "Oslo"}}'), _req(tools=TOOLS), 1)
    assert [c.empty for c in out] == [False]
    assert out[-1].tool_calls[0].arguments == {"city": "Oslo"}


async def test_a_grammar_backends_answer_is_checked_as_it_streams_on_retries_too() -> None:
    """with_retry took `constrained` and dropped it when it retried: a grammar backend's output was buffered and
    rewritten there, as if no grammar had made it."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for constrained, sent in ((False, '{"n":3}'), (True, '{"n": "3"}')):  # rewritten, or passed as it came
        out = [c async for c in with_retry(Backend('{"n": "3"}'), _req(format=schema), 1, ModelCounts(), [],
                                           constrained=constrained)]
        assert "".join(c.text for c in out) == sent
