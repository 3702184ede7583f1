"""The routes' helpers over several streams: every stream whole, side by side, or merged as items come."""
from __future__ import annotations

import asyncio

import pytest

from adapters.errors import BackendError
from proxy.streams import collect_each


async def test_one_stream_failing_stops_the_others_work():
    """`n` choices collected whole: one failing (a 429, a backend error) left the others running on to their end,
    unawaited, holding the key's slot and the backend's."""
    closed = asyncio.Event()

    async def long() -> object:
        try:
            for i in range(100):
                await asyncio.sleep(0.05)
                yield i
        finally:
            closed.set()

    async def failing() -> object:
        await asyncio.sleep(0.05)
        raise BackendError("refused")
        yield  # pragma: no cover - an async generator

    with pytest.raises(BackendError):
        await collect_each([long(), failing()])
    await asyncio.wait_for(closed.wait(), 1)
