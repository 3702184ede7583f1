"""The official `ollama` and `openai` clients on every route of theirs that Velo serves, over every backend kind: each
answer parses into the client's own types, and what a client builds from a stream equals the whole answer."""
from __future__ import annotations

import ollama
import openai
import pytest

from tests.conformance.conftest import CHAT_MODELS, EMBED_MODELS
from tests.conformance.wire import BYPASS

pytestmark = pytest.mark.slow
LIMIT = 8
USER = [{"role": "user", "content": "Name three colours."}]
OPTIONS = {"temperature": 0, "num_predict": LIMIT}


def clients(url: str) -> tuple[ollama.AsyncClient, openai.AsyncOpenAI]:
    return (ollama.AsyncClient(host=url, headers=BYPASS),
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, default_headers=BYPASS))


@pytest.mark.parametrize("backend", list(CHAT_MODELS))
async def test_ollama_chat_and_generate(velo, backend):
    oll, _ = clients(velo)
    model = CHAT_MODELS[backend]
    whole = await oll.chat(model=model, messages=USER, options=OPTIONS)
    parts = [p async for p in await oll.chat(model=model, messages=USER, options=OPTIONS, stream=True)]
    assert whole.done and whole.done_reason in ("stop", "length") and whole.eval_count <= LIMIT
    assert parts[-1].done and parts[-1].done_reason == whole.done_reason and parts[-1].message.content == ""
    assert "".join(p.message.content for p in parts if not p.done) == whole.message.content
    said = await oll.generate(model=model, prompt="Name three colours.", options=OPTIONS)
    pieces = [p async for p in await oll.generate(model=model, prompt="Name three colours.", options=OPTIONS,
                                                  stream=True)]
    assert said.done and "".join(p.response for p in pieces if not p.done) == said.response
    assert pieces[-1].response == "" and pieces[-1].eval_count == said.eval_count


async def test_ollama_models_and_embeddings(velo):
    oll, _ = clients(velo)
    listed = {m.model for m in (await oll.list()).models}
    assert {CHAT_MODELS["engine"], f'{CHAT_MODELS["llamacpp"]}:latest', CHAT_MODELS["ollama"]} <= listed  # as Ollama
    assert (await oll.ps()).models
    for backend, model in EMBED_MODELS.items():
        assert len((await oll.embed(model=model, input=["red", "green"])).embeddings) == 2, backend
        assert (await oll.embeddings(model=model, prompt="red")).embedding, backend
    for model in CHAT_MODELS.values():
        assert (await oll.show(model)).modelinfo is not None


async def test_ollama_pull_reaches_the_ollama_backend(velo, ollama_upstream):
    oll, _ = clients(velo)
    progress = [p async for p in await oll.pull("double-pulled:latest", stream=True)]
    assert progress[-1].status == "success" and (await oll.pull("double-pulled:latest")).status == "success"


@pytest.mark.parametrize("backend", list(CHAT_MODELS))
async def test_openai_chat_completions_and_responses(velo, backend):
    _, oai = clients(velo)
    model = CHAT_MODELS[backend]
    whole = await oai.chat.completions.create(model=model, messages=USER, temperature=0, max_tokens=LIMIT)
    stream = await oai.chat.completions.create(model=model, messages=USER, temperature=0, max_tokens=LIMIT,
                                               stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].delta.content is None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    said = await oai.completions.create(model=model, prompt="Three colours are", temperature=0, max_tokens=LIMIT)
    pieces = [c async for c in await oai.completions.create(model=model, prompt="Three colours are", temperature=0,
                                                            max_tokens=LIMIT, stream=True)]
    assert "".join(c.choices[0].text for c in pieces) == said.choices[0].text
    response = await oai.responses.create(model=model, input="Name three colours.", temperature=0,
                                          max_output_tokens=LIMIT)
    events = [e async for e in await oai.responses.create(model=model, input="Name three colours.", temperature=0,
                                                          max_output_tokens=LIMIT, stream=True)]
    assert response.status in ("completed", "incomplete") and events[-1].type in ("response.completed",
                                                                                  "response.incomplete")
    assert events[-1].response.output_text == response.output_text


async def test_openai_models_and_embeddings(velo):
    _, oai = clients(velo)
    ids = [m.id async for m in oai.models.list()]
    assert {CHAT_MODELS["engine"], CHAT_MODELS["llamacpp"], CHAT_MODELS["ollama"]} <= set(ids)
    assert (await oai.models.retrieve(CHAT_MODELS["engine"])).id == CHAT_MODELS["engine"]
    for backend, model in EMBED_MODELS.items():
        got = await oai.embeddings.create(model=model, input=["red", "green"])
        assert [d.index for d in got.data] == [0, 1] and got.data[0].embedding, backend
    with pytest.raises(openai.NotFoundError) as info:
        await oai.chat.completions.create(model="no-such-model", messages=USER)
    assert info.value.code == "model_not_found"
