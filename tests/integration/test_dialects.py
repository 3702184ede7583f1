"""All four dialects over the real backends: the official `ollama`, `openai` (chat and responses) and `anthropic`
clients -> `velo serve` -> the embedded engine and the real llama-server, both on SmolLM2-135M.

Greedy decoding, with each model's [models] options setting every knob some dialect's defaults set differently
(Ollama's repeat_penalty 1.1, ...), makes every dialect's request the same internal request, so they must get the
same text and the same tool calls, and an answer cached through one dialect must replay through the others.
The engine runs without its prefix cache here: on a CPU with AMX, oneDNN rounds a whole prompt's matmuls (AMX
tiles) and a cached prefix's one-token chunk (AVX-512) differently, enough to flip a greedy near-tie."""
from __future__ import annotations

from typing import Iterator

import aiohttp
import anthropic
import ollama
import openai
import orjson
import pytest

from proxy.config_example import toml_value
from tests.scripted import SAME_IN_EVERY_DIALECT
from tests.velo_serve import velo_serve

MODELS = {"engine": "smollm2:135m", "llama": "llama-smollm2"}
WEATHER = {"name": "get_weather", "description": "Get the current weather for a city",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"type": "string", "maxLength": 20}}}}
NO_CACHE = {"Cache-Control": "no-cache"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def velo(llama_chat, tmp_path_factory) -> Iterator[str]:
    """`velo serve` with the cache on, in front of the embedded engine and the real llama-server."""
    with velo_serve(tmp_path_factory.mktemp("dialects"), f"""
[[backends]]
name = "engine"
kind = "engine"
options = {{ progress = false, enable_prefix_cache = false }}
[[backends]]
name = "llama"
kind = "llamacpp"
url = "{llama_chat.url}"
models = ["{MODELS['llama']}"]
""" + "".join(f'[models."{m}"]\noptions = {toml_value(SAME_IN_EVERY_DIALECT)}\n' for m in MODELS.values())) as url:
        yield url


def sdks(url: str, headers: dict[str, str] | None = None):
    return (ollama.AsyncClient(host=url, headers=headers),
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, default_headers=headers),
            anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0, default_headers=headers))


async def answers(url: str, model: str, prompt: str, tokens: int, headers: dict | None = None) -> dict[str, str]:
    """The same greedy question through each dialect's official client."""
    oll, oai, ant = sdks(url, headers)
    user = [{"role": "user", "content": prompt}]
    out = {"ollama": (await oll.chat(model=model, messages=user,
                                     options={"temperature": 0, "num_predict": tokens})).message.content,
           "openai": (await oai.chat.completions.create(model=model, messages=user, temperature=0,
                                                        max_tokens=tokens)).choices[0].message.content}
    msg = await ant.messages.create(model=model, messages=user, max_tokens=tokens, extra_body={"temperature": 0})
    out["anthropic"] = msg.content[0].text
    out["responses"] = (await oai.responses.create(model=model, input=prompt, temperature=0,
                                                   max_output_tokens=tokens)).output_text
    return out


@pytest.mark.parametrize("backend", ["engine", "llama"])
async def test_every_dialect_gets_the_same_answer(velo, backend):
    got = await answers(velo, MODELS[backend], "Name three colours.", 12, NO_CACHE)
    assert got["ollama"] and len(set(got.values())) == 1, got


@pytest.mark.parametrize("backend", ["engine", "llama"])
async def test_streams_give_what_whole_answers_give(velo, backend):
    _, oai, ant = sdks(velo, NO_CACHE)
    model, user = MODELS[backend], [{"role": "user", "content": "Count to five."}]
    whole = await ant.messages.create(model=model, messages=user, max_tokens=10, extra_body={"temperature": 0})
    async with ant.messages.stream(model=model, messages=user, max_tokens=10,
                                   extra_body={"temperature": 0}) as stream:
        streamed = await stream.get_final_message()
    assert streamed.content[0].text == whole.content[0].text and streamed.stop_reason == "max_tokens"
    async with oai.responses.stream(model=model, input="Count to five.", temperature=0,
                                    max_output_tokens=10) as stream:
        final = await stream.get_final_response()
    assert final.output_text == whole.content[0].text and final.status == "incomplete"


@pytest.mark.parametrize("backend", ["engine", "llama"])
async def test_an_answer_cached_through_one_dialect_replays_through_the_others(velo, backend):
    model, prompt = MODELS[backend], f"Say something about {backend}s."
    first = await answers(velo, model, prompt, 8)
    async with aiohttp.ClientSession() as s:
        user = [{"role": "user", "content": prompt}]
        calls = [("/api/chat", {"model": model, "messages": user, "stream": False,
                                "options": {"temperature": 0, "num_predict": 8}}),
                 ("/v1/chat/completions", {"model": model, "messages": user, "temperature": 0, "max_tokens": 8}),
                 ("/v1/messages", {"model": model, "messages": user, "temperature": 0, "max_tokens": 8}),
                 ("/v1/responses", {"model": model, "input": prompt, "temperature": 0, "max_output_tokens": 8})]
        for path, body in calls:
            async with s.post(velo + path, json=body) as resp:
                assert resp.status == 200 and resp.headers["X-Velo-Cache"] == "exact", path
    assert len(set(first.values())) == 1, first


@pytest.mark.parametrize("backend", ["engine", "llama"])
async def test_a_forced_tool_call_is_the_same_in_every_dialect_that_can_force_one(velo, backend):
    _, oai, ant = sdks(velo, NO_CACHE)
    model, ask = MODELS[backend], "What is the weather in Paris?"
    chat = await oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": ask}], temperature=0, max_tokens=40,
        tools=[{"type": "function", "function": WEATHER}], tool_choice="required")
    msg = await ant.messages.create(
        model=model, messages=[{"role": "user", "content": ask}], max_tokens=40, extra_body={"temperature": 0},
        tools=[{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}],
        tool_choice={"type": "any"})
    resp = await oai.responses.create(model=model, input=ask, temperature=0, max_output_tokens=40,
                                      tools=[{"type": "function", **WEATHER}], tool_choice="required")
    call = chat.choices[0].message.tool_calls[0].function
    calls = {(call.name, orjson.dumps(orjson.loads(call.arguments)).decode()),
             (msg.content[-1].name, orjson.dumps(msg.content[-1].input).decode()),
             (resp.output[-1].name, orjson.dumps(orjson.loads(resp.output[-1].arguments)).decode())}
    assert len(calls) == 1 and next(iter(calls))[0] == "get_weather", calls
    assert msg.stop_reason == "tool_use" and chat.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("backend", ["engine", "llama"])
async def test_token_counts_come_from_the_backends_tokenizer(velo, backend):
    _, oai, ant = sdks(velo)
    user = [{"role": "user", "content": "Hello there, how are you today?"}]
    counted = await ant.messages.with_raw_response.count_tokens(model=MODELS[backend], messages=user)
    assert counted.headers["X-Velo-Token-Count"] == "exact"
    answer = await oai.chat.completions.create(model=MODELS[backend], messages=user, max_tokens=1,
                                               extra_headers=NO_CACHE)
    assert (await counted.parse()).input_tokens == answer.usage.prompt_tokens


@pytest.mark.parametrize("backend", ["engine", "llama"])
async def test_token_counts_include_the_tools_written_into_the_prompt(velo, backend):
    """SmolLM2's template ignores tools, so on the engine Velo writes them into the prompt (llama-server renders
    them itself): the count is of the prompt the request that follows reads (before, count_tokens and the fit stage
    counted the engine's chat without its tools)."""
    _, oai, ant = sdks(velo)
    user = [{"role": "user", "content": "Hello there, how are you today?"}]
    tool = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
    bare = (await ant.messages.count_tokens(model=MODELS[backend], messages=user)).input_tokens
    counted = (await ant.messages.count_tokens(model=MODELS[backend], messages=user, tools=[tool])).input_tokens
    answer = await oai.chat.completions.with_raw_response.create(
        model=MODELS[backend], messages=user, max_tokens=1, tools=[{"type": "function", "function": WEATHER}],
        extra_headers=NO_CACHE)
    assert answer.headers["X-Velo-Tools"] == {"engine": "prompt", "llama": "native"}[backend]
    assert counted == answer.parse().usage.prompt_tokens and counted > bare + 20


@pytest.mark.parametrize("backend", ["engine", "llama"])
async def test_a_chat_ending_in_an_assistant_turn_is_continued(velo, backend):
    """Prefill: the model goes on from the assistant's text, and only what it adds comes back (Anthropic's API, as
    Ollama and llama-server do it); before, the engine closed that turn and began a new one ("Hello, welcome")."""
    oll, _, ant = sdks(velo, NO_CACHE)
    said = [{"role": "user", "content": "Say hello"}, {"role": "assistant", "content": "Hello,"}]
    msg = await ant.messages.create(model=MODELS[backend], messages=said, max_tokens=8, extra_body={"temperature": 0})
    native = await oll.chat(model=MODELS[backend], messages=said, options={"temperature": 0, "num_predict": 8})
    text = msg.content[0].text
    assert text and not text.lstrip().startswith("Hello") and native.message.content == text, text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("backend", ["engine", "llama"])
async def test_anthropic_names_the_stop_sequence_that_ended_the_answer(velo, backend, stream):
    """`stop_reason: "stop_sequence"` and which one: llama-server's OpenAI routes say it only in their debug field,
    and every such answer on it ended as `end_turn`."""
    _, _, ant = sdks(velo, NO_CACHE)
    args = dict(model=MODELS[backend], max_tokens=40, stop_sequences=[",", ".", "\n"], extra_body={"temperature": 0},
                messages=[{"role": "user", "content": "Count: one, two, three, four"}])
    if stream:
        async with ant.messages.stream(**args) as s:
            msg = await s.get_final_message()
    else:
        msg = await ant.messages.create(**args)
    assert (msg.stop_reason, msg.stop_sequence in args["stop_sequences"]) == ("stop_sequence", True), msg
    assert msg.content and not any(stop in msg.content[0].text for stop in args["stop_sequences"])
