"""The two newest dialects over each HTTP backend kind: the official `anthropic` and `openai` (responses)
clients -> Velo -> the Ollama protocol double and the OpenAI-compatible fake (tests/fakes.py), streamed and not,
with tool calls and thinking, and Codex's compaction; and token ids to /v1/embeddings, which only one kind takes."""
from __future__ import annotations

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from adapters.base import BackendConfig
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config
from tests.fakes import FakeOpenAI, OllamaDouble

MODELS = {"ollama": "smollm2:135m", "openai": "fake-gpt"}
READ = {"name": "read_file", "description": "Read a file", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


@pytest.fixture(params=["ollama", "openai"])
async def velo(request):
    """(base URL, the fake upstream) for each backend kind."""
    fake = OllamaDouble() if request.param == "ollama" else FakeOpenAI(models=[MODELS["openai"]])
    async with fake:
        fake.script.reply = "Paris is the capital."
        fake.script.tool_calls = [{"name": "read_file", "arguments": {"path": "a.py"}}]
        cfg = Config(backends=[BackendConfig(name="up", kind=request.param, urls=[fake.url])],
                     cache=CacheConfig(enabled=False))
        server = TestServer(make_app(cfg), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            yield str(server.make_url("")).rstrip("/"), request.param, fake
        finally:
            await server.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_messages_with_tools(velo, stream):
    url, kind, fake = velo
    client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
    args = dict(model=MODELS[kind], max_tokens=64, tools=[READ], messages=[{"role": "user", "content": "Read a.py"}])
    if stream:
        async with client.messages.stream(**args) as s:
            msg = await s.get_final_message()
    else:
        msg = await client.messages.create(**args)
    assert msg.content[0].text == "Paris is the capital." and msg.stop_reason == "tool_use"
    assert (msg.content[1].name, msg.content[1].input) == ("read_file", {"path": "a.py"})
    sent = fake.last("/api/chat" if kind == "ollama" else "/v1/chat/completions")
    assert sent["tools"][0]["function"]["name"] == "read_file"


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_with_tools(velo, stream):
    url, kind, fake = velo
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    args = dict(model=MODELS[kind], input="Read a.py", tools=[{"type": "function", "name": "read_file",
                                                              "parameters": READ["input_schema"]}])
    if stream:
        async with client.responses.stream(**args) as s:
            r = await s.get_final_response()
    else:
        r = await client.responses.create(**args)
    assert r.output_text == "Paris is the capital." and r.status == "completed"
    call = r.output[-1]
    assert (call.type, call.name, call.arguments) == ("function_call", "read_file", '{"path":"a.py"}')


@pytest.mark.parametrize("velo", ["ollama"], indirect=True)
async def test_thinking_from_ollama_comes_back_in_both_dialects(velo):
    url, kind, fake = velo
    fake.models[MODELS[kind]].capabilities.append("thinking")  # as Ollama's /api/show says of a thinking model
    fake.script.thinking, fake.script.tool_calls = "Let me see.", []
    ant = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
    msg = await ant.messages.create(model=MODELS[kind], max_tokens=64, thinking={"type": "enabled",
                                    "budget_tokens": 1024}, messages=[{"role": "user", "content": "Hi"}])
    assert fake.last("/api/chat")["think"] is True
    assert [(b.type, getattr(b, "thinking", None)) for b in msg.content][0] == ("thinking", "Let me see.")
    oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    r = await oai.responses.create(model=MODELS[kind], input="Hi", reasoning={"effort": "high"})
    assert fake.last("/api/chat")["think"] == "high"
    assert r.output[0].type == "reasoning" and r.output[0].summary[0].text == "Let me see."


@pytest.mark.parametrize("velo", ["openai"], indirect=True)
@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
@pytest.mark.parametrize("stream", [False, True])
async def test_thinking_from_an_openai_server_under_either_name_comes_back_under_both(velo, field, stream):
    """vLLM since 0.16 writes `reasoning` only (its thinking was lost here), llama-server `reasoning_content`; a
    client reads one or the other: LiteLLM and Open WebUI the second, Ollama's /v1 clients the first."""
    url, kind, fake = velo
    fake.reasoning_field, fake.script.thinking, fake.script.tool_calls = field, "Let me see.", []
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/chat/completions", json={
                "model": MODELS[kind], "stream": stream, "messages": [{"role": "user", "content": "Hi"}]}) as resp:
            text = await resp.text()
    if stream:
        deltas = [c[0]["delta"] for line in text.splitlines() if line.startswith("data: {")
                  if (c := orjson.loads(line[6:])["choices"])]
        message = {k: "".join(d.get(k) or "" for d in deltas) for k in ("reasoning", "reasoning_content", "content")}
    else:
        message = orjson.loads(text)["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == "Let me see."
    assert message["content"] == "Paris is the capital."


@pytest.mark.parametrize("velo", ["ollama"], indirect=True)
@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_thinking_sent_back_under_either_name_reaches_ollama(velo, field):
    url, kind, fake = velo
    fake.script.tool_calls = []
    oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    await oai.chat.completions.create(model=MODELS[kind], messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello.", field: "They greet me."},
        {"role": "user", "content": "Again"}])
    assert fake.last("/api/chat")["messages"][1]["thinking"] == "They greet me."


async def test_codex_compaction_over_each_backend(velo):
    """Compaction v2 as Codex streams it: one compaction item carrying the backend's summary, asked without tools;
    sent back, the backend reads the summary as a user turn."""
    url, kind, fake = velo
    fake.script.tool_calls = []
    path = "/api/chat" if kind == "ollama" else "/v1/chat/completions"
    history = [{"role": "user", "content": "Read a.py"}, {"role": "assistant", "content": "It prints 1."}]
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/responses", json={
                "model": MODELS[kind], "input": history + [{"type": "compaction_trigger"}], "stream": True,
                "tools": [{"type": "function", "name": "read_file", "parameters": READ["input_schema"]}]}) as resp:
            done = [orjson.loads(line[6:]) for line in (await resp.text()).splitlines()
                    if line.startswith("data: ") and '"response.output_item.done"' in line]
        [item] = [event["item"] for event in done]
        assert orjson.loads(item["encrypted_content"])["summary"] == "Paris is the capital."
        assert "tools" not in fake.last(path) and fake.last(path)["messages"][-1]["role"] == "user"
        async with http.post(url + "/v1/responses", json={"model": MODELS[kind], "input": [
                history[0], item, {"role": "user", "content": "Go on"}]}) as resp:
            assert resp.status == 200
    assert fake.last(path)["messages"][1]["content"].endswith("Paris is the capital.")


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_stop_sequence_where_the_backend_names_it(velo, stream):
    """`stop_reason: "stop_sequence"` and the string, where the backend says which stop ended the answer (vLLM's
    `stop_reason`, as the OpenAI fake sends it); Ollama does not say, so its answer ends as `end_turn`."""
    url, kind, fake = velo
    fake.script.tool_calls = []
    client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
    args = dict(model=MODELS[kind], max_tokens=64, stop_sequences=["the cap", "nowhere"],
                messages=[{"role": "user", "content": "Capital of France?"}])
    if stream:
        async with client.messages.stream(**args) as s:
            msg = await s.get_final_message()
    else:
        msg = await client.messages.create(**args)
    if kind == "openai":
        assert (msg.content[0].text.strip(), msg.stop_reason, msg.stop_sequence) == ("Paris is", "stop_sequence",
                                                                                     "the cap")
    else:
        assert (msg.stop_reason, msg.stop_sequence) == ("end_turn", None)


@pytest.mark.parametrize("velo", ["openai"], indirect=True)
async def test_token_ids_reach_an_openai_compatible_server_as_they_are(velo):
    """OpenAI's token input, which vLLM takes as OpenAI does; Velo refused it."""
    url, kind, fake = velo
    oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    answer = await oai.embeddings.create(model=MODELS[kind], input=[[1, 2, 3], [4]])
    assert fake.last("/v1/embeddings")["input"] == [[1, 2, 3], [4]]
    assert len(answer.data) == 2 and answer.usage.prompt_tokens == 4  # the server's count: the ids themselves


# what an Ollama backend cannot take as token ids: (the SDK's call, the field named, the message, Ollama's path)
_IDS_FOR_OLLAMA = {
    "embeddings": (lambda oai: oai.embeddings.create(model=MODELS["ollama"], input=[1, 2, 3]), "input",
                   "cannot embed token ids", "/api/embed"),
    "completions": (lambda oai: oai.completions.create(model=MODELS["ollama"], prompt=[1, 2, 3]), "prompt",
                    "cannot complete token ids", "/api/generate"),
}


@pytest.mark.parametrize("velo", ["ollama"], indirect=True)
@pytest.mark.parametrize("endpoint", list(_IDS_FOR_OLLAMA))
async def test_token_ids_for_ollama_are_the_clients_400_in_openais_shape(velo, endpoint):
    """Ollama embeds and completes text only (EmbedHandler answers anything else 400 "invalid input type";
    /api/generate's prompt is a string): Velo says so, as a 400 naming the field, without asking Ollama (a
    completion would have sent it an empty prompt)."""
    url, kind, fake = velo
    call, param, said, path = _IDS_FOR_OLLAMA[endpoint]
    with pytest.raises(openai.BadRequestError) as e:
        await call(openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0))
    assert (e.value.param, e.value.code, e.value.type) == (param, None, "invalid_request_error")
    assert said in e.value.message and path not in [r.path for r in fake.requests]


@pytest.mark.parametrize("velo", ["openai"], indirect=True)
async def test_a_prompt_of_token_ids_reaches_an_openai_compatible_server_as_it_is(velo):
    """vLLM takes `prompt` as token ids, one prompt's or a batch's; Velo refused every token array."""
    url, kind, fake = velo
    oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    answer = await oai.completions.create(model=MODELS[kind], prompt=[[1, 2, 3], [4]], max_tokens=5)
    assert sorted(r.body["prompt"] for r in fake.requests if r.path == "/v1/completions") == [[1, 2, 3], [4]]
    assert [c.text for c in answer.choices] == ["Paris is the capital."] * 2


@pytest.mark.parametrize("stream", [False, True])
async def test_an_anthropic_prefill_is_continued_by_vllm(stream):
    """A prefill (the chat ends in an assistant turn, as Anthropic's API defines it) reaches a server whose listing
    says it is vLLM with `continue_final_message`, so its template leaves that turn open; the answer holds only
    what the model adds."""
    fake = FakeOpenAI(models=["qwen"], owner="vllm")
    async with fake:
        fake.script.reply = '"city": "Paris"}'
        cfg = Config(backends=[BackendConfig(name="up", kind="openai", urls=[fake.url])],
                     cache=CacheConfig(enabled=False))
        server = TestServer(make_app(cfg), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            client = anthropic.AsyncAnthropic(base_url=str(server.make_url("")), api_key="k", max_retries=0)
            args = dict(model="qwen", max_tokens=64, messages=[{"role": "user", "content": "Paris as JSON"},
                                                               {"role": "assistant", "content": "{"}])
            if stream:
                async with client.messages.stream(**args) as s:
                    msg = await s.get_final_message()
            else:
                msg = await client.messages.create(**args)
        finally:
            await server.close()
    sent = fake.last("/v1/chat/completions")
    assert sent["messages"][-1] == {"role": "assistant", "content": "{"}
    assert (sent["continue_final_message"], sent["add_generation_prompt"]) == (True, False)
    assert "{" + msg.content[0].text.replace(" ", "") == '{"city":"Paris"}'


@pytest.mark.parametrize("empty", ["", []])
async def test_anthropic_empty_last_assistant_turn_is_left_out(velo, empty):
    """Anthropic's API allows an empty last assistant turn and answers as without it: passed on, vLLM's template
    wrote it as a closed empty turn before the model's own."""
    url, kind, fake = velo
    fake.script.tool_calls = []
    client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
    await client.messages.create(model=MODELS[kind], max_tokens=16, messages=[
        {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": empty}])
    sent = fake.last("/api/chat" if kind == "ollama" else "/v1/chat/completions")["messages"]
    assert [m["role"] for m in sent] == ["user"]


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_tool_choice_none_makes_no_call_on_ollama(velo, stream):
    """Ollama has no tool_choice: sent the tools under "none", its model called one and the client got a tool_use
    block it had ruled out (and a model without the `tools` capability would be refused). Now it gets no tools."""
    url, kind, fake = velo
    if kind != "ollama":
        pytest.skip("OpenAI-compatible servers take tool_choice themselves")
    client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
    args = dict(model=MODELS[kind], max_tokens=32, messages=[{"role": "user", "content": "Read a.py"}], tools=[READ],
                tool_choice={"type": "none"})
    if stream:
        async with client.messages.stream(**args) as s:
            msg = await s.get_final_message()
    else:
        msg = await client.messages.create(**args)
    assert [b.type for b in msg.content] == ["text"] and msg.stop_reason == "end_turn"
    assert "tools" not in fake.last("/api/chat")
