"""The commands' HTTP client: error bodies in both dialects, and connections llama-server drops."""
from __future__ import annotations

import asyncio

import pytest

from proxy.commands import CommandError
from proxy.commands import client
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


async def _silent_server(handle) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_request_read_by_a_server_that_then_hung_up_is_not_sent_again():
    """Only a pooled connection's failure is retried: one the server closed after reading the request (a backend
    that crashed on it) got the generation a second time."""
    posts = []

    async def read_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        posts.append(await reader.readuntil(b"\r\n\r\n"))
        writer.close()
    server, url = await _silent_server(read_then_close)
    async with server, open_session(None) as session:
        with pytest.raises(CommandError, match="Server disconnected"):
            async with chat_stream(session, url, "m", [{"role": "user", "content": "hi"}], max_tokens=2):
                pass
    assert len(posts) == 1


async def test_a_server_that_never_answers_is_given_up_on(monkeypatch):
    """No read timeout: chat and bench waited forever on a server that accepted the connection and said nothing."""
    monkeypatch.setattr(client, "SILENCE_S", 0.3)

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
    server, url = await _silent_server(silent)
    async with server, open_session(None) as session:
        with pytest.raises(CommandError, match="failed"):
            await asyncio.wait_for(client.get_json(session, url + "/api/tags"), 5)


@pytest.mark.parametrize("key, sent", [("k1\r\n", "Bearer k1"), (" k1 ", "Bearer k1")])
async def test_an_api_key_read_with_its_line_end_is_sent_without_it(key, sent):
    async with open_session(key) as session:
        assert session.headers["Authorization"] == sent


def test_an_api_key_with_a_control_character_inside_is_one_line():
    with pytest.raises(CommandError, match="control character"):
        open_session("k\x001")
