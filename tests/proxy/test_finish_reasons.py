"""How an OpenAI-compatible server's end of an answer reaches each dialect, through the official clients: a
withheld answer (`content_filter`) as each API says it and never cached; a request the server gave up on
(vLLM's and SGLang's `abort`) as a failure, never a whole answer to replay."""
from __future__ import annotations

import anthropic
import ollama
import openai
import pytest
from aiohttp.test_utils import TestServer
from pydantic import BaseModel

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config
from tests.fakes import FakeOpenAI

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
async def velo():
    async with FakeOpenAI(models=["m"]) as fake:
        cfg = Config(backends=[BackendConfig(name="up", kind="openai", urls=[fake.url])], cache=CacheConfig())
        server = TestServer(make_app(cfg), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            yield str(server.make_url("")).rstrip("/"), fake
        finally:
            await server.close()


def _chats(fake: FakeOpenAI) -> int:
    return len([r for r in fake.requests if r.path == "/v1/chat/completions"])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_withheld_answer_says_so_in_every_dialect_and_is_never_replayed(velo, stream):
    url, fake = velo
    fake.script.finish_reason = "content_filter"
    oa = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    if stream:
        chunks = [c async for c in await oa.chat.completions.create(model="m", messages=HI, temperature=0,
                                                                    stream=True)]
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        answer = await oa.chat.completions.create(model="m", messages=HI, temperature=0)
        reasons = [answer.choices[0].finish_reason]
    assert reasons == ["content_filter"]
    an = anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0)
    if stream:
        async with an.messages.stream(model="m", max_tokens=64, messages=HI) as events:
            message = await events.get_final_message()
        async with oa.responses.stream(model="m", input="Hi", temperature=0) as events:
            response = await events.get_final_response()
        done = [part async for part in await ollama.AsyncClient(host=url).chat(
            model="m", messages=HI, options={"temperature": 0}, stream=True)][-1]
    else:
        message = await an.messages.create(model="m", max_tokens=64, messages=HI)
        response = await oa.responses.create(model="m", input="Hi", temperature=0)
        done = await ollama.AsyncClient(host=url).chat(model="m", messages=HI, options={"temperature": 0})
    assert message.stop_reason == "refusal"
    assert response.status == "incomplete" and response.incomplete_details.reason == "content_filter"
    assert done.done_reason == "stop"
    before = _chats(fake)
    await oa.chat.completions.create(model="m", messages=HI, temperature=0)
    assert _chats(fake) == before + 1  # asked again: nothing was kept


async def test_an_answer_the_server_gave_up_on_is_a_failure_not_an_answer(velo):
    url, fake = velo
    fake.script.finish_reason = "abort"
    oa = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError, match="finish_reason 'abort'"):
            await oa.chat.completions.create(model="m", messages=HI, temperature=0)
    assert _chats(fake) == 2


class Person(BaseModel):
    name: str
    age: int


@pytest.mark.parametrize("stream", [False, True])
async def test_a_cut_structured_answer_raises_the_sdks_finish_reason_errors(velo, stream):
    """The server does not enforce the format, so Velo repairs and checks its answer; a cut one went through that
    check too and was a 502 ('"age" is a required property'), which the SDK retried into the same cut."""
    url, fake = velo
    fake.script.reply = '{"name": "Ada Lovelace", "age": 36}'
    oa = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)

    async def parse(**args) -> None:
        if not stream:
            await oa.chat.completions.parse(model="m", messages=HI, response_format=Person, **args)
            return
        async with oa.chat.completions.stream(model="m", messages=HI, response_format=Person, **args) as events:
            await events.get_final_completion()
    with pytest.raises(openai.LengthFinishReasonError):
        await parse(max_tokens=3)
    fake.script.finish_reason = "content_filter"
    fake.script.reply = '{"name": "Ada'
    with pytest.raises(openai.ContentFilterFinishReasonError):
        await parse()
