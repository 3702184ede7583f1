"""Whole assistant turns: each model family's call format, only offered tools, coercions, dedupe, failures."""
from __future__ import annotations

import pytest

from adapters.protocol import Tool, ToolCall
from proxy.tools.calls import ToolCallInvalid
from proxy.tools.coerce import usable
from proxy.tools.stream import repair_message

WEATHER = Tool("get_weather", "Current weather", {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "alerts": {"type": "boolean"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "ratio": {"type": "number"},
                   "tags": {"type": "array", "items": {"type": "string"}},
                   "where": {"type": "object", "properties": {"lat": {"type": "number"}}}},
    "required": ["city"], "additionalProperties": False})
SEARCH = Tool("search", "Web search", {"type": "object", "properties": {"query": {"type": "string"}},
                                       "required": ["query"]})
TOOLS = [WEATHER, SEARCH]
PARIS = {"city": "Paris"}

FORMATS = [
    ("hermes/qwen", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("hermes unclosed", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    ("llama3 python_tag", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>'),
    ("llama3 bare", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("mistral v3", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("mistral v11", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
    ("functionary", '<function=get_weather>{"city": "Paris"}</function>'),
    ("json fence", 'Sure:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'),
    ("plain fence", '```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'),
    ("one-line fence", '```{"name": "get_weather", "arguments": {"city": "Paris"}}```'),
    ("closed once too often", '{"name": "get_weather", "arguments": {"city": "Paris"}}}'),
    ("array closed once too often", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]]'),
    ("one-line json fence", '```json {"name": "get_weather", "arguments": {"city": "Paris"}} ```'),
    ("openai shape",
     '{"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}'),
    ("tool_calls wrapper", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'),
    ("array", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("prose around", 'Let me check. {"name": "get_weather", "arguments": {"city": "Paris"}} One moment.'),
    ("flattened", '{"name": "get_weather", "city": "Paris"}'),
    ("prefixed name", '{"name": "functions.get_weather", "arguments": {"city": "Paris"}}'),
    ("name case", '{"name": "Get_Weather", "arguments": {"city": "Paris"}}'),
]


@pytest.mark.parametrize("text", [f[1] for f in FORMATS], ids=[f[0] for f in FORMATS])
def test_each_family_format_gives_one_call(text: str) -> None:
    _, calls, report = repair_message(text, [], TOOLS)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", PARIS)]
    assert calls[0].id.startswith("call_")
    assert report.extracted == 1


FENCED = [f for f in FORMATS if "fence" in f[0]]


@pytest.mark.parametrize("text", [f[1] for f in FENCED], ids=[f[0] for f in FENCED])
def test_a_fenced_call_leaves_no_fence_behind(text: str) -> None:
    assert repair_message(text, [], TOOLS)[0] in ("", "Sure:")


@pytest.mark.parametrize("text", [f[1] for f in FORMATS if "too often" in f[0]])
def test_stray_closers_after_a_call_leave_with_it(text: str) -> None:
    assert repair_message(text, [], TOOLS)[0] == ""


def test_json_that_is_no_call_keeps_its_stray_closers() -> None:
    assert repair_message('The data is {"a": 1}} ok', [], TOOLS)[0] == 'The data is {"a": 1}} ok'


def test_call_text_is_removed_and_prose_kept() -> None:
    content, calls, _ = repair_message('Let me check. {"name": "search", "arguments": {"query": "x"}} Done.', [], TOOLS)
    assert content == "Let me check.  Done." and calls[0].arguments == {"query": "x"}


def test_several_calls_in_one_turn() -> None:
    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
            '<tool_call>{"name": "search", "arguments": {"query": "news"}}</tool_call>')
    _, calls, report = repair_message(text, [], TOOLS)
    assert [c.name for c in calls] == ["get_weather", "search"] and report.extracted == 2


def test_a_call_written_again_in_another_form_is_deduped() -> None:
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    _, calls, report = repair_message(f"[{call}, {call}]\n<tool_call>{call}</tool_call>", [], TOOLS)
    assert len(calls) == 2 and report.deduped == 1  # the array's two items stay; the tag re-emits one


def test_a_block_of_several_calls_repeated_whole_is_deduped() -> None:
    a = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    b = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    _, calls, report = repair_message(f"<tool_call>{a}\n{b}</tool_call><tool_call>{a}\n{b}</tool_call>", [], TOOLS)
    assert [c.arguments["city"] for c in calls] == ["Paris", "Rome"] and report.deduped == 2


@pytest.mark.parametrize("render", [
    lambda calls: "[" + ", ".join(calls) + "]",
    lambda calls: "<tool_call>\n" + "\n".join(calls) + "\n</tool_call>",
    lambda calls: "".join(f"<tool_call>{c}</tool_call>\n" for c in calls),
    lambda calls: "```json\n" + ",\n".join(calls) + "\n```",
])
def test_identical_calls_listed_as_items_of_one_answer_are_all_kept(render) -> None:
    """Two samples of each of two distributions: four calls, two pairs identical by design."""
    normal = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    other = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    _, calls, report = repair_message(render([normal, normal, other, other]), [], TOOLS)
    assert [c.arguments["city"] for c in calls] == ["Paris", "Paris", "Rome", "Rome"] and report.deduped == 0


def test_structured_calls_are_items_and_text_that_repeats_them_is_deduped() -> None:
    structured = [ToolCall("get_weather", {"city": "Paris", "days": 2}, "a"),
                  ToolCall("get_weather", {"city": "Paris", "days": 2}, "b"),
                  ToolCall("get_weather", {"city": "Rome", "days": 2}, "c")]
    text = '<tool_call>{"name": "get_weather", "arguments": {"days": 2, "city": "Paris"}}</tool_call>'
    content, calls, report = repair_message(text, structured, TOOLS)
    assert [c.id for c in calls] == ["a", "b", "c"] and report.deduped == 1 and content == ""


@pytest.mark.parametrize("separator", ["\n", ",\n", ", ", "", "\n\n", "; "])
@pytest.mark.parametrize("wrap", [lambda body: f"<tool_call>\n{body}\n</tool_call>",
                                  lambda body: f"```json\n{body}\n```",
                                  lambda body: f"<|python_tag|>{body}<|eom_id|>", lambda body: f"[TOOL_CALLS] {body}"])
def test_every_call_in_one_block_is_kept_whatever_separates_them(separator: str, wrap) -> None:
    calls = [f'{{"name": "get_weather", "arguments": {{"city": "{c}"}}}}' for c in ("Paris", "Rome", "Oslo")]
    _, found, report = repair_message(wrap(separator.join(calls)), [], TOOLS)
    assert [c.arguments["city"] for c in found] == ["Paris", "Rome", "Oslo"] and not report.invalid


@pytest.mark.parametrize("text", [
    '{"name": "Bob", "age": 3}',  # JSON that is data, not a call
    'The config is ```json\n{"debug": true}\n```',
    "```python\nprint({'name': 'get_weather'})\n```",
])
def test_json_that_is_not_a_call_stays_content(text: str) -> None:
    content, calls, report = repair_message(text, [], TOOLS)
    assert content == text.strip() and calls == [] and not report.changed


def test_nothing_is_extracted_when_no_tools_are_offered() -> None:
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    content, calls, report = repair_message(text, [], [])
    assert content == text and calls == [] and not report.changed


def test_a_tool_that_was_not_offered_is_never_called() -> None:
    """Its JSON is the model's answer, sent as content as Ollama and llama-server send it (reported invalid), or a
    failure where the request demands a call."""
    text = '{"name": "delete_files", "arguments": {"path": "/"}}'
    content, calls, report = repair_message(text, [], TOOLS)
    assert content == text and calls == [] and report.unoffered == 1 and len(report.invalid) == 1
    with pytest.raises(ToolCallInvalid, match="delete_files: not an offered tool"):
        repair_message(text, [], TOOLS, must_call=True)


def test_an_unknown_call_next_to_prose_stays_as_content() -> None:
    text = 'I would call {"name": "delete_files", "arguments": {}} but cannot.'
    content, calls, report = repair_message(text, [], TOOLS)
    assert content == text and calls == [] and len(report.invalid) == 1


def test_arguments_the_schema_rejects_are_an_error_not_a_call() -> None:
    with pytest.raises(ToolCallInvalid, match='"city" is a required property'):
        repair_message('<tool_call>{"name": "get_weather", "arguments": {"days": 2}}</tool_call>', [], TOOLS)


def test_one_bad_call_beside_a_good_one_keeps_the_good_one() -> None:
    text = ('<tool_call>{"name": "get_weather", "arguments": {"days": 2}}</tool_call>'
            '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>')
    content, calls, report = repair_message(text, [], TOOLS)
    assert [c.name for c in calls] == ["search"] and "get_weather" in content and len(report.invalid) == 1


COERCIONS = [
    ({"days": "5"}, {"days": 5}),
    ({"days": "5.0"}, {"days": 5}),
    ({"ratio": "0.5"}, {"ratio": 0.5}),
    ({"alerts": "true"}, {"alerts": True}),
    ({"alerts": "False"}, {"alerts": False}),
    ({"tags": "rain"}, {"tags": ["rain"]}),
    ({"tags": '["rain", "wind"]'}, {"tags": ["rain", "wind"]}),
    ({"unit": "Celsius"}, {"unit": "celsius"}),
    ({"where": '{"lat": 48.8}'}, {"where": {"lat": 48.8}}),
    ({"city": 75001}, {"city": "75001"}),
    ({"extra": 1}, {}),  # additionalProperties: false
    ({"days": "1" * 25}, {"days": int("1" * 25)}),  # past 64 bits, written whole (adapters/exact_json.py)
    ({"days": "-" + "9" * 400}, {"days": -int("9" * 400)}),  # 400 digits were a 500 while orjson wrote them
]


@pytest.mark.parametrize("given,expected", COERCIONS, ids=[str(c[0]) for c in COERCIONS])
def test_each_safe_coercion_is_made_and_recorded(given: dict, expected: dict) -> None:
    _, calls, report = repair_message("", [ToolCall("get_weather", {"city": "Paris", **given}, "x")], TOOLS)
    assert calls[0].arguments == {"city": "Paris", **expected}
    assert len(report.coerced) == 1 and report.coerced[0].startswith("get_weather.")


@pytest.mark.parametrize("given", [{"days": "five"}, {"days": "5.5"}, {"alerts": "yes"}, {"unit": "kelvin"},
                                   {"days": "1" * 4301}])  # past the digits Python's int() and json convert
def test_unsafe_coercions_are_refused(given: dict) -> None:
    with pytest.raises(ToolCallInvalid):
        repair_message("", [ToolCall("get_weather", {"city": "Paris", **given}, "x")], TOOLS)


def test_repairs_are_reported_by_kind_without_values() -> None:
    text = "<tool_call>{'name': 'get_weather', 'arguments': {'city': 'Paris', 'days': '2',}}"
    _, calls, report = repair_message(text, [], TOOLS)
    assert calls[0].arguments == {"city": "Paris", "days": 2}
    summary = report.summary()
    assert "extracted=1" in summary and "single_quotes" in summary and "trailing_comma" in summary
    assert "coerced=1" in summary and "Paris" not in summary


@pytest.mark.parametrize("text", ["<tool_call>\nI think the city is Paris</tool_call>", "[TOOL_CALLS] sorry"])
def test_a_call_marker_without_a_parsable_call_is_an_invalid_attempt(text: str) -> None:
    with pytest.raises(ToolCallInvalid, match=r"no parsable call after (<tool_call>|\[TOOL_CALLS\])"):
        repair_message(text, [], TOOLS)


def test_a_schema_with_a_remote_ref_is_never_fetched_and_its_calls_go_out_unchecked() -> None:
    """Nothing to check against (a fetch would let a client's schema make Velo open connections): the call goes out as
    the model wrote it, as through Ollama."""
    remote = Tool("fetchy", "", {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/a.json"}}})
    assert not usable(remote.parameters)
    _, calls, report = repair_message('{"name": "fetchy", "arguments": {"a": 1}}', [], [remote])
    assert [(c.name, c.arguments) for c in calls] == [("fetchy", {"a": 1})] and report.skipped == ["schema"]


def test_a_tool_definition_echoed_in_a_fence_is_text_not_a_failed_call() -> None:
    """Qwen2.5-Coder-0.5B answered a read-this-file request with the tool's signature in a json fence."""
    echo = ('```json\n{"type": "function", "function": {"name": "search", "description": "Web search", '
            '"parameters": {"type": "object", "properties": {"query": {"type": "string"}}, '
            '"required": ["query"]}}}\n```')
    content, calls, report = repair_message(echo, [], TOOLS)
    assert calls == [] and content == echo and not report.invalid


def test_an_integer_in_a_string_is_read_exactly() -> None:
    """Through a float, "12345678901234567893" became 12345678901234567168."""
    _, calls, _ = repair_message("", [ToolCall("get_weather", {"city": "Paris", "days": "12345678901234567893"},
                                               "x")], TOOLS)
    assert calls[0].arguments["days"] == 12345678901234567893


@pytest.mark.parametrize("args", ['{"city": "Paris", "days": 12345678901234567890123}',
                                  "{'city': 'Paris', 'days': 12345678901234567890123,}"])
def test_an_integer_past_64_bits_in_a_call_stays_whole(args: str) -> None:
    """orjson reads it as a float: 1.2345678901234568e22 went out, where the model wrote the integer."""
    text = '<tool_call>{"name": "get_weather", "arguments": %s}</tool_call>' % args
    _, calls, _ = repair_message(text, [], [Tool("get_weather", parameters={"type": "object"})])
    assert calls[0].arguments["days"] == 12345678901234567890123


def test_a_broken_call_with_a_huge_number_is_repaired_not_a_crash() -> None:
    """The repair library reads any integer, and orjson writes none past 64 bits (a TypeError, and a 500); it stays
    whole, as JSON that needs no repair is read (adapters/exact_json.py)."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 1' + "0" * 30 + ', x: tru}}'
    _, calls, _ = repair_message(text + "</tool_call>", [], [Tool("get_weather", parameters={"type": "object"})])
    assert calls[0].arguments["days"] == 10**30


def test_a_key_a_pattern_allows_is_kept_and_coerced_by_its_pattern() -> None:
    """`patternProperties` beside `additionalProperties: false`: a key it allows was dropped from the call as not
    in the schema, whenever another coercion made the arguments be walked."""
    tool = Tool("paint", "Paint", {"type": "object", "properties": {"n": {"type": "integer"}},
                                   "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False})
    _, calls, _ = repair_message("", [ToolCall("paint", {"n": "2", "x_coats": "3", "other": 1}, "x")], [tool])
    assert calls[0].arguments == {"n": 2, "x_coats": 3}
