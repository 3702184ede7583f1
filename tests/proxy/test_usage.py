"""The prompt tokens a backend's prefix cache served, in each dialect's own usage fields, read by the official clients:
OpenAI's `prompt_tokens_details.cached_tokens`, the Responses API's `input_tokens_details.cached_tokens`, and
Anthropic's `cache_read_input_tokens` beside the `input_tokens` it did not cover."""
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
    scripted.script.cached_tokens = 0  # none cached: OpenAI's usage as before, without the details
    plain = await oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}])
    assert plain.usage.prompt_tokens == 5 and plain.usage.prompt_tokens_details is None
