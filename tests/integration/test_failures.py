"""Backends that are down, slow, failing or cut mid-stream, as the real `openai` and `ollama` clients see them
through Velo: the right HTTP status and a message naming the backend, or an error event inside the stream."""

import ollama
import openai
import pytest

from adapters.base import BackendConfig
from tests.fakes import FakeOpenAI
from tests.integration.conftest import clients, config, serve

MODEL = "fake-gpt"
MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("kind", ["llamacpp", "openai", "ollama"])
async def test_backend_down_is_503_in_both_dialects(kind, dead_port):
    url = f"http://127.0.0.1:{dead_port}"
    async with serve(config(BackendConfig(name="down", kind=kind, urls=[url], models=[MODEL]))) as velo:
        oai, oll = clients(velo)
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as e:
                await oai.chat.completions.create(model=MODEL, messages=MSG, stream=stream)
            assert e.value.status_code == 503
            assert "'down'" in e.value.message and url in e.value.message and "not reachable" in e.value.message
            with pytest.raises(ollama.ResponseError) as e2:
                result = await oll.chat(model=MODEL, messages=MSG, stream=stream)
                if stream:
                    [p async for p in result]
            assert e2.value.status_code == 503 and "not reachable" in e2.value.error


@pytest.fixture
async def fake_behind_velo():
    async with FakeOpenAI() as fake:
        backend = BackendConfig(name="up", kind="openai", urls=[fake.url], first_token_timeout=0.3)
        async with serve(config(backend)) as velo:
            yield fake, velo


async def test_cut_mid_stream_ends_with_an_error_event(fake_behind_velo):
    fake, velo = fake_behind_velo
    oai, oll = clients(velo)
    fake.script.reply = "one two three four five"
    fake.script.cut_after = 3  # role chunk, "one", " two", then the connection drops
    got = []
    with pytest.raises(openai.APIError) as e:
        async for chunk in await oai.chat.completions.create(model=MODEL, messages=MSG, stream=True):
            got.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert "".join(got) == "one two" and "'up'" in e.value.message and "broke the stream" in e.value.message

    parts = []
    with pytest.raises(ollama.ResponseError) as e2:
        async for part in await oll.chat(model=MODEL, messages=MSG, stream=True):
            parts.append(part.message.content)
    assert "".join(parts) == "one two" and "broke the stream" in e2.value.error


async def test_cut_ollama_backend_mid_stream(ollama_double):
    ollama_double.script.reply = "one two three"
    ollama_double.script.cut_after = 2
    async with serve(config(BackendConfig(name="o", kind="ollama", urls=[ollama_double.url]))) as velo:
        _, oll = clients(velo)
        parts = []
        with pytest.raises(ollama.ResponseError) as e:
            async for part in await oll.generate(model="smollm2:135m", prompt="count", stream=True):
                parts.append(part.response)
    assert parts == ["one", " two"] and "'o'" in e.value.error


async def test_slow_backend_is_504(fake_behind_velo):
    fake, velo = fake_behind_velo
    oai, oll = clients(velo)
    fake.script.token_delay = 1.0
    with pytest.raises(openai.APIStatusError) as e:
        await oai.chat.completions.create(model=MODEL, messages=MSG, stream=True)
    assert e.value.status_code == 504 and "within 0.3s" in e.value.message
    with pytest.raises(ollama.ResponseError) as e2:
        [p async for p in await oll.chat(model=MODEL, messages=MSG, stream=True)]
    assert e2.value.status_code == 504 and "'up'" in e2.value.error


async def test_upstream_errors_keep_their_meaning(fake_behind_velo):
    fake, velo = fake_behind_velo
    oai, oll = clients(velo)
    with pytest.raises(openai.NotFoundError):
        await oai.chat.completions.create(model="nope", messages=MSG)
    fake.script.fail_status, fake.script.fail_message = 500, "CUDA out of memory"
    with pytest.raises(openai.APIStatusError) as e:
        await oai.chat.completions.create(model=MODEL, messages=MSG)
    assert e.value.status_code == 502 and "CUDA out of memory" in e.value.message
    with pytest.raises(ollama.ResponseError) as e2:
        await oll.chat(model=MODEL, messages=MSG)
    assert e2.value.status_code == 502 and "CUDA out of memory" in e2.value.error
