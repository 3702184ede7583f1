"""Upstream plumbing details that no fake server shows by itself."""
import asyncio

from adapters.base import BackendConfig
from adapters.http import Upstream

ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok": 123}'


async def test_a_keep_alive_connection_closed_by_the_server_is_retried_once():
    """Like llama-server dropping an idle connection just as Velo reuses it: the request is sent again."""
    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        for served in range(2):
            try:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)  # the `{}` body
            except asyncio.IncompleteReadError:  # the client closed the connection
                return
            if served == 0:
                writer.write(ANSWER)
        writer.close()  # the second request on this connection: hang up without answering

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = Upstream(BackendConfig(name="b", kind="openai", urls=[f"http://127.0.0.1:{port}"]))
    try:
        assert await up.call("POST", "/x", {}) == {"ok": 123}
        assert await up.call("POST", "/x", {}) == {"ok": 123}
        assert len(connections) == 2  # the reused one was dropped, the retry opened a fresh one
    finally:
        await up.close()
        server.close()
