"""The API key check: which keys pass, and that a guess learns nothing from how long the check took."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import make_mocked_request

from adapters.errors import Unauthorized
from proxy import auth
from proxy.auth import caller_for, is_one_of
from proxy.config import Config, ServerConfig
from tests.scripted import Script


class Watched(str):
    """A configured key that notes each time it is compared as a string."""

    compared: list[str] = []

    def __eq__(self, other: object) -> bool:
        Watched.compared.append(str(self))
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_a_key_is_one_of_the_configured_keys_only_when_it_is_one_whole():
    keys = ("sk-alpha", "sk-beta")
    assert is_one_of("sk-beta", keys) and is_one_of("sk-alpha", keys)
    assert not is_one_of("sk-bet", keys) and not is_one_of("sk-betaa", keys) and not is_one_of("", keys)
    assert not is_one_of(None, keys) and not is_one_of("sk-alpha", ())


def test_no_key_is_compared_as_a_string():
    """A string compare ends at the first byte that differs, which tells a guess how much of a key it got right."""
    # the memos of configured keys compare an equal config's keys (config with config) on a hit: a rerun of this
    # test in one process saw its first run's
    for memo in (auth._digests, auth.key_labels):
        memo.cache_clear()
    server = ServerConfig(api_keys=[Watched("sk-gamma"), Watched("sk-delta")])
    Watched.compared = []
    assert caller_for(_asked_with("sk-delta"), server).tenant != "anonymous"
    with pytest.raises(Unauthorized):
        caller_for(_asked_with("sk-deltx"), server)
    assert Watched.compared == []


def test_the_header_that_holds_a_configured_key_is_the_one_read():
    """Claude Code sends its ANTHROPIC_AUTH_TOKEN as a Bearer beside ANTHROPIC_API_KEY's x-api-key: a Bearer left
    over from another service, beside the key Velo knows, was a 401."""
    server = ServerConfig(api_keys=["sk-velo"])

    def asked(**headers: str):
        return make_mocked_request("POST", "/v1/messages", headers=headers)
    velo = auth.tenant_of("sk-velo")
    assert caller_for(asked(Authorization="Bearer sk-elsewhere", **{"x-api-key": "sk-velo"}), server).tenant == velo
    assert caller_for(asked(Authorization="Bearer sk-velo", **{"x-api-key": "sk-elsewhere"}), server).tenant == velo
    with pytest.raises(Unauthorized):
        caller_for(asked(Authorization="Bearer sk-elsewhere", **{"x-api-key": "sk-nor-here"}), server)
    unkeyed = ServerConfig()  # no keys: the Bearer scopes the request, as before
    assert caller_for(asked(Authorization="Bearer a", **{"x-api-key": "b"}), unkeyed).tenant == auth.tenant_of("a")


def _asked_with(key: str):
    return make_mocked_request("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"})


@pytest.mark.parametrize("config, status", [(Config(server=ServerConfig(api_keys=["sk-alpha"])), b"401"),
                                            (Config(), b"200")])
async def test_a_key_that_is_not_utf8_is_refused_or_scoped_not_a_500(client, status):
    """aiohttp reads a header's bytes that are not UTF-8 as lone surrogates, which the key's hash could not encode."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sk-\xff\xfe\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 " + status)


async def test_a_client_name_that_is_not_utf8_is_listed_with_the_requests_in_flight(client, scripted):
    """The name went into the list of requests in flight as lone surrogates, which made listing them a 500."""
    scripted.script = Script(delay=1.0)
    body = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":false}'
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"X-Velo-Client: ed\xff\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    for _ in range(50):
        listed = await client.get("/velo/requests")
        assert listed.status == 200
        if clients := [r["client"] for r in (await listed.json())["requests"]]:
            break
        await asyncio.sleep(0.02)
    writer.close()
    assert clients == ["ed\ufffd"]
