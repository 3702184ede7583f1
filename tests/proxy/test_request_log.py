"""Each generation request logs when its answer starts and when it ends, with the outcome; prompts only when asked."""
from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import make_app
from proxy.config import Config, ServerConfig
from tests.scripted import ScriptedBackend

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "secret question"}], "stream": True}


@pytest.fixture(autouse=True)
def info_logs(caplog):
    caplog.set_level(logging.INFO, logger="velo.requests")


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "velo.requests"]


async def until_logged(caplog, fragment: str) -> list[str]:
    """The server logs the end of a cancelled stream once its handler notices; wait for it (5 s at most)."""
    for _ in range(500):
        if any(fragment in line for line in lines(caplog)):
            break
        await asyncio.sleep(0.01)
    return lines(caplog)


async def test_a_stream_logs_its_start_and_its_end_without_the_prompt(client, caplog):
    resp = await client.post("/api/chat", json=CHAT)
    await resp.read()
    start, end = lines(caplog)
    # named by the id the response, /velo/requests and the long-request warning give it
    named = resp.headers["X-Velo-Request-Id"]
    assert start.startswith(named + " ") and end.startswith(named + " ")
    assert "/api/chat tiny on scripted: answer started after" in start and "(cache skip)" in start
    assert "done (stop) after" in end and "3 tokens" in end
    assert "secret" not in start + end and "Hello" not in end


async def test_an_answer_of_one_token_logs_1_token(client, scripted, caplog):
    scripted.script.pieces = ["Hi"]
    await (await client.post("/api/chat", json=CHAT)).read()
    end = lines(caplog)[-1]
    assert "done (stop) after" in end and ", 1 token" in end and "1 tokens" not in end


async def test_log_prompts_logs_the_prompt_and_the_answer(scripted, caplog):
    app = make_app(Config(server=ServerConfig(log_prompts=True)), {"scripted": scripted})
    async with TestClient(TestServer(app)) as client:
        await (await client.post("/v1/chat/completions", json=CHAT)).read()
    start, end = lines(caplog)
    assert start.endswith("prompt: 'secret question'") and end.endswith("answer: 'Hello world'")


async def test_log_prompts_logs_a_prompt_of_token_ids_as_its_ids(scripted, caplog):
    """Its text prompt is "": the log showed an empty prompt."""
    app = make_app(Config(server=ServerConfig(log_prompts=True)), {"scripted": scripted})
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": [15, 4, 92], "stream": True})
        await resp.read()
    assert lines(caplog)[0].endswith("prompt: 'token ids [15, 4, 92]'")


async def test_log_prompts_says_how_many_ids_a_long_prompt_of_token_ids_has_past_those_shown(scripted, caplog):
    """The first 75 ids alone read as the whole prompt: an 8,191-id prompt was logged as 75 ids."""
    app = make_app(Config(server=ServerConfig(log_prompts=True)), {"scripted": scripted})
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": [7] * 100, "stream": True})
        await resp.read()
    assert lines(caplog)[0].endswith(f"prompt: 'token ids {[7] * 75} and 25 more'")


async def test_a_request_for_one_answer_logs_one_line_saying_what_a_start_line_would(scripted, caplog):
    app = make_app(Config(server=ServerConfig(log_prompts=True)), {"scripted": scripted})
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": False})
        assert resp.status == 200
    [end] = lines(caplog)
    assert end.startswith(resp.headers["X-Velo-Request-Id"] + " /v1/chat/completions tiny on scripted: done (stop)")
    assert "3 tokens (cache skip); prompt: 'secret question'; answer: 'Hello world'" in end


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_that_fails_before_its_answer_logs_its_prompt_with_log_prompts(scripted, caplog, stream):
    """With no start line, the end line is the only one: a one-answer request's said "error 502" without the prompt
    the README says its end line carries, and so did a stream's, the request a user looks for in the log."""
    scripted.script.fail_after = 0
    app = make_app(Config(server=ServerConfig(log_prompts=True)), {"scripted": scripted})
    async with TestClient(TestServer(app)) as client:
        await (await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})).read()
    [end] = lines(caplog)
    assert "error 502:" in end and "0 tokens; prompt: 'secret question'; answer: ''" in end


async def test_a_client_that_leaves_is_logged_as_cancelled(client, scripted, caplog):
    scripted.script.delay = 0.2
    resp = await client.post("/api/chat", json=CHAT)
    await resp.content.readline()
    resp.close()
    logged = await until_logged(caplog, "cancelled by client")
    assert any("answer started" in line for line in logged) and any("cancelled by client" in line for line in logged)


async def test_an_admins_cancel_is_logged_as_velos_not_the_clients(client, scripted, caplog):
    scripted.script.delay = 0.2
    resp = await client.post("/api/chat", json=CHAT)
    await resp.content.readline()
    assert (await client.delete(f"/velo/requests/{resp.headers['X-Velo-Request-Id']}")).status == 200
    await resp.read()
    logged = await until_logged(caplog, "cancelled")
    assert "cancelled: cancelled by an administrator after" in logged[-1], logged


async def test_a_failure_is_logged_with_its_error(client, scripted, caplog):
    scripted.script.fail_after = 1
    await (await client.post("/api/chat", json=CHAT)).read()
    assert "error 502: scripted backend broke mid-stream" in lines(caplog)[-1]


@pytest.mark.parametrize("log_prompts", [False, True])
async def test_an_error_that_quotes_the_answer_is_logged_without_it_unless_prompts_are(scripted, caplog, log_prompts):
    """A JSON answer that is no JSON is a 502 quoting the answer's start, which went to the log with log_prompts
    off."""
    app = make_app(Config(server=ServerConfig(log_prompts=log_prompts)), {"scripted": scripted})
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/api/chat", json={**CHAT, "stream": False, "format": "json"})
        assert resp.status == 502 and "Hello world" in (await resp.json())["error"]  # the client still reads it
    end = lines(caplog)[-1]
    assert "error 502:" in end and ("Hello world" in end) == log_prompts


async def test_a_stream_kept_open_by_heartbeats_logs_no_answer_text_when_it_fails(scripted, caplog):
    """Once heartbeats had opened the stream, the failure was logged again as 'failed mid-way', with its message."""
    caplog.set_level(logging.WARNING)
    scripted.script.delay = 0.05
    app = make_app(Config(server=ServerConfig(heartbeat_s=0.01)), {"scripted": scripted})
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/api/chat", json={**CHAT, "format": "json"})
        assert resp.status == 200 and b"Hello world" in await resp.read()  # the stream's error event says it
    said = [r.getMessage() for r in caplog.records]
    assert any("failed mid-way" in m for m in said) and not any("Hello world" in m for m in said)
