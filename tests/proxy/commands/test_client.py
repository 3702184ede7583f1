"""The commands' HTTP client: error bodies in both dialects, and connections llama-server drops."""
from __future__ import annotations

import asyncio

import pytest

from proxy.commands.client import chat_stream, error_text, open_session


def test_error_text_in_both_dialects():
    assert error_text(b'{"error": "model \\"x\\" not found, try pulling it first"}') == \
        'model "x" not found, try pulling it first'
    assert error_text(b'{"error": {"message": "Incorrect API key provided", "type": "auth"}}') == \
        "Incorrect API key provided"
    assert error_text(b"<html>Bad Gateway</html>") == "<html>Bad Gateway</html>"


@pytest.mark.slow
async def test_llama_server_closing_each_streamed_connection_costs_nothing(llama_chat):
    """llama-server closes a connection after each streamed answer without saying so: reusing it from the pool
    failed every other request ('Server disconnected', 'Can not write request body'), several at once when
    a bench level starts more streams than the last."""
    async def ask() -> str:
        messages = [{"role": "user", "content": "hi"}]
        async with chat_stream(session, llama_chat.url, "any", messages, max_tokens=2) as reply:
            return "".join([t async for t in reply.texts()])

    async with open_session(None) as session:
        for _ in range(4):
            await ask()
        await asyncio.gather(*(ask() for _ in range(4)))
        await asyncio.gather(*(ask() for _ in range(4)))
