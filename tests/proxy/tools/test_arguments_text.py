"""Each call's arguments keep the model's own text where they needed no repair, whatever the call's place: every
item of an array of calls, and arguments written before the name. Those went out written anew ("1e5" as
"100000.0", "caf\\u00e9" as "café"), so the client sent the history back respelled and missed the prefix cache."""
from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient

from proxy.tools.stream import repair_message
from tests.fakes import FakeOpenAI
from tests.proxy.test_tool_call_bytes import ARGS, _chat_arguments_all, served  # noqa: F401 (a fixture)
from tests.proxy.tools.test_calls import TOOLS

OTHER = '{ "n" : 2.50,"path":"a\\/b" }'
# each holds a call with ARGS and then one with OTHER; ARGS holds an "arguments" key of its own
KEPT = [
    '[{"name": "f", "arguments": %s}, {"name": "f", "arguments": %s}]' % (ARGS, OTHER),  # bare
    'Both.\n```json\n[{"name": "f", "arguments": %s},\n {"name": "f", "arguments": %s}]\n```' % (ARGS, OTHER),
    '<tool_call>\n[{"name": "f", "arguments": %s}, {"name": "f", "arguments": %s}]\n</tool_call>' % (ARGS, OTHER),
    '[TOOL_CALLS] [{"name": "f", "arguments": %s}, {"name": "f", "arguments": %s}]' % (ARGS, OTHER),  # Mistral v3
    '[{"arguments": %s, "name": "f"}, {"id": "2", "parameters": %s, "name": "f", "type": "function"}]' % (ARGS, OTHER),
    '<tool_call>\n{"arguments": %s, "name": "f"}\n{"name": "f", "arguments": %s, "id": 7}\n</tool_call>'
    % (ARGS, OTHER),
]
WEATHER = '{"city": "caf\\u00e9", "days": 1e0}'


@pytest.mark.parametrize("text", [
    '[{"name": "get_weather", "arguments": %s}, {"name": "search", "arguments": {"query":"x"}}]' % WEATHER,
    '{"arguments": %s, "name": "get_weather"}' % WEATHER,
    '<tool_call>{"parameters": %s,\n "name": "get_weather"}</tool_call>' % WEATHER,
    '{"tool_calls": [{"function": {"name": "get_weather", "arguments": %s}}, {"name": "search", "arguments": '
    '"{\\"query\\": \\"x\\"}"}], "meta": {"tools": 2}}' % WEATHER,  # a wrapper, and arguments as a string
    '[{"name": "get_weather", "meta": {"a": {}}, "arguments": %s}, {"name": "search", "input": {"query":"x"}}]'
    % WEATHER])
def test_arguments_in_an_array_or_before_the_name_keep_their_text(text: str) -> None:
    _, calls, _ = repair_message(text, [], TOOLS)
    assert calls[0].text == WEATHER and calls[0].arguments == json.loads(WEATHER) == {"city": "café", "days": 1.0}


@pytest.mark.parametrize("text", [
    '[{"name": "get_weather", "arguments": {"city": "Paris",}}, {"name": "search", "arguments": {"query": "x"}}]',
    # the same key twice: the value is the last one's, and the first is found first
    '[{"name": "get_weather", "arguments": {"city": "Rome"}, "arguments": {"city": "Paris"}, "id": "1"}, '
    '{"name": "search", "arguments": {"query": "x"}}]',
    # equal in Python, but 1 is no 1.0: the second is found in the next call's place, or after the last
    '[{"name": "get_weather", "arguments": {"city": "Paris", "ratio": 1}, "arguments": {"city": "Paris", '
    '"ratio": 1.0}}, {"name": "search", "arguments": {"query": "x"}}]',
    '[{"name": "search", "arguments": {"query": "x"}}, {"name": "get_weather", "arguments": {"city": "Paris", '
    '"ratio": 1}, "arguments": {"city": "Paris", "ratio": 1.0}}]',
    # another member's object holding the key, before the arguments or after them
    '[{"name": "get_weather", "meta": {"arguments": {"city": "Rome"}}, "arguments": {"city": "Paris"}}, '
    '{"name": "search", "arguments": {"query": "x"}}]',
    '{"tool_calls": [{"name": "search", "arguments": {"query": "x"}}, {"name": "get_weather", "arguments": '
    '{"city": "Paris"}}], "meta": {"arguments": {"city": "Paris"}}}'])
def test_arguments_not_found_for_certain_are_written_anew(text: str) -> None:
    _, calls, _ = repair_message(text, [], TOOLS)
    assert [c.text for c in calls] == ["", ""] and any(c.arguments.get("city") == "Paris" for c in calls)


@pytest.mark.parametrize("reply", KEPT)
@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat_sends_each_calls_arguments_as_written(served: tuple[TestClient, FakeOpenAI],  # noqa: F811
                                                                 reply: str, stream: bool) -> None:
    client, up = served
    up.script.tool_calls, up.script.reply = [], reply
    assert await _chat_arguments_all(client, stream) == [ARGS, OTHER]
