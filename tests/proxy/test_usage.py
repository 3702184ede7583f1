"""The prompt tokens a backend's prefix cache served, in each dialect's own usage fields, read by the official clients
in whole answers and streams: OpenAI's `prompt_tokens_details.cached_tokens`, the Responses API's
`input_tokens_details.cached_tokens`, and Anthropic's `cache_read_input_tokens` beside the `input_tokens` it did not
cover; and the fields OpenAI always sends around them."""
from __future__ import annotations

import anthropic
import openai

from tests.scripted import ScriptedBackend


async def test_cached_prompt_tokens_in_every_dialects_usage(base_url, scripted: ScriptedBackend):
    scripted.script.cached_tokens = 3  # of the scripted prompt's 5
    oai = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
    chat = await oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert (chat.usage.prompt_tokens, chat.usage.prompt_tokens_details.cached_tokens) == (5, 3)
    resp = await oai.responses.create(model="tiny", input="hi")
    assert (resp.usage.input_tokens, resp.usage.input_tokens_details.cached_tokens) == (5, 3)
    msg = await anthropic.AsyncAnthropic(base_url=base_url, api_key="x", max_retries=0).messages.create(
        model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens) == (2, 3)
    chunks = [c async for c in await oai.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})]
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 3
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key="x", max_retries=0).messages.stream(
            model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as stream:
        final = await stream.get_final_message()
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (2, 3)
    streamed = [e async for e in await oai.responses.create(model="tiny", input="hi", stream=True)]
    assert streamed[-1].response.usage.input_tokens_details.cached_tokens == 3
    scripted.script.cached_tokens = 0  # none cached: the details still there, as OpenAI sends them on a miss
    plain = await oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}])
    assert plain.usage.prompt_tokens == 5 and plain.usage.prompt_tokens_details.cached_tokens == 0


async def test_an_openai_message_has_every_field_openai_sends(client):
    """`refusal` and `annotations` are in every OpenAI chat message; typed clients in stricter languages need them."""
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user",
                                                                                         "content": "hi"}]})
    message = (await resp.json())["choices"][0]["message"]
    assert message["refusal"] is None and message["annotations"] == []
