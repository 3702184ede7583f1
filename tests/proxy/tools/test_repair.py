"""JSON repair: each breakage small models produce, the value it must become, and the fix it is reported as."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.exact_json import dumps, loads
from proxy.tools.repair import Unrepairable, decode_arguments, parse_json, parse_json_values

# (broken text, expected value, a fix that must be reported)
CASES = [
    ('{"city": "Paris",}', {"city": "Paris"}, "trailing_comma"),
    ('[1, 2, 3,]', [1, 2, 3], "trailing_comma"),
    ('{"a": 1,, "b": 2}', {"a": 1, "b": 2}, "extra_comma"),
    ("{'city': 'Paris'}", {"city": "Paris"}, "single_quotes"),
    ("{'quote': 'say \"hi\"'}", {"quote": 'say "hi"'}, "single_quotes"),
    ('{city: "Paris", days: 3}', {"city": "Paris", "days": 3}, "unquoted_keys"),
    ('{"ok": True, "v": None, "no": False}', {"ok": True, "v": None, "no": False}, "python_literals"),
    ('{"a": 1 // the count\n}', {"a": 1}, "comments"),
    ('{"a": /* inline */ 1}', {"a": 1}, "comments"),
    ('{"a": 1 # python comment\n}', {"a": 1}, "comments"),
    ('{"city": "Paris", "days": 3', {"city": "Paris", "days": 3}, "truncated"),
    ('{"city": "Par', {"city": "Par"}, "truncated"),
    ('{"a": {"b": [1, 2', {"a": {"b": [1, 2]}}, "truncated"),
    ('{"a": 1, "b":', {"a": 1}, "truncated"),
    ('{"a": 1, "b', {"a": 1}, "truncated"),
    ('Here you go: {"a": 1}', {"a": 1}, "stray_text"),
    ('{"a": 1} Let me know if you need more.', {"a": 1}, "stray_text"),
    ('{"a": 1 "b": 2}', {"a": 1, "b": 2}, "missing_comma"),
    ('{"x": .5, "y": 2.}', {"x": 0.5, "y": 2.0}, "number_format"),
    ('{"x": NaN}', {"x": None}, "non_json_literal"),
    ('{"text": "line one\nline two"}', {"text": "line one\nline two"}, "control_chars"),
    ('{"a": [1, 2}', {"a": [1, 2]}, "mismatched_bracket"),
    ('{"a": (1, 2)}', {"a": [1, 2]}, "python_tuple"),
    ('{"a": 1}}', {"a": 1}, "stray_text"),
]


@pytest.mark.parametrize("text,value,fix", CASES, ids=[c[2] + ":" + c[0][:20] for c in CASES])
def test_repairs_to_value_and_names_the_fix(text: str, value: object, fix: str) -> None:
    out = parse_json(text)
    assert out.value == value
    assert fix in out.fixes


# A missing closing quote: the string swallows the brackets after it. The fast pass must not take that as the
# value ("units}}]" validates as a string); the library reads it as the value that was meant.
MISSING_QUOTE = [
    ('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius}}',
     {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}),
    ('{"city": "Paris", "unit": "units}}]', {"city": "Paris", "unit": "units"}),
    ('[{"q": "tallest building}]', [{"q": "tallest building"}]),
    ('{"city": "Paris, "days": 3}', {"city": "Paris", "days": 3}),
]


@pytest.mark.parametrize("text,value", MISSING_QUOTE)
def test_a_string_that_swallowed_structure_is_no_value(text: str, value: object) -> None:
    out = parse_json(text)
    assert out.value == value and out.fixes == ["json_repair"]


def test_a_quote_that_fits_in_one_place_only_is_put_back() -> None:
    """The library reads this as to=["ada@example.com], ", "subject\": \"Hi"]: valid, and wrong."""
    out = parse_json('{"to": ["ada@example.com], "subject": "Hi"}')
    assert out.value == {"to": ["ada@example.com"], "subject": "Hi"} and out.fixes == ["missing_quote"]


def test_a_repair_that_leaves_a_key_inside_a_string_is_refused() -> None:
    """Two quotes missing: no single one makes the text JSON, and the library's reading is wrong."""
    with pytest.raises(Unrepairable):
        parse_json('{"to": ["a@b.c], "cc": ["d@e.f], "subject": "Hi"}')


def test_a_string_cut_off_at_the_end_is_still_a_truncation() -> None:
    out = parse_json('{"body": "Dear Ada, thank you for')
    assert out.value == {"body": "Dear Ada, thank you for"} and "truncated" in out.fixes


@pytest.mark.parametrize("separator", ["\n", ",", ", ", "", ";\n"])
def test_values_one_after_another_are_all_parsed(separator: str) -> None:
    text = separator.join(['{"a": 1}', "{'b': 2,}", '{"c": [3'])
    assert [v.value for v in parse_json_values(text)] == [{"a": 1}, {"b": 2}, {"c": [3]}]


def test_valid_json_is_untouched() -> None:
    out = parse_json('{"a": [1, {"b": null}]}')
    assert out.value == {"a": [1, {"b": None}]} and out.fixes == []


def test_falls_back_to_json_repair_for_what_the_fast_pass_refuses() -> None:
    out = parse_json('{"a": 1, "b": "two" "c": three}')
    assert out.fixes == ["json_repair"]
    assert out.value["a"] == 1 and out.value["b"] == "two"


@pytest.mark.parametrize("text", ["no json here at all", "", "   "])
def test_text_without_json_is_unrepairable(text: str) -> None:
    with pytest.raises(Unrepairable):
        parse_json(text)


def test_doubly_encoded_arguments_are_decoded() -> None:
    fixes: list[str] = []
    assert decode_arguments('"{\\"city\\": \\"Paris\\"}"', fixes) == {"city": "Paris"}
    assert fixes.count("double_encoded") == 2


def test_string_arguments_are_parsed_and_repaired() -> None:
    fixes: list[str] = []
    assert decode_arguments("{'city': 'Paris',}", fixes) == {"city": "Paris"}
    assert {"double_encoded", "single_quotes", "trailing_comma"} <= set(fixes)


def test_empty_arguments_string_is_an_empty_object() -> None:
    fixes: list[str] = []
    assert decode_arguments("  ", fixes) == {} and fixes == ["empty_arguments"]


_JSONISH = st.text(alphabet=st.sampled_from(list('{}[]():,"\'\\ \n#/*-.0123456789abcnrtuelsTFN_')), max_size=60)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(_JSONISH, st.text(max_size=60)))
def test_any_text_gives_plain_json_or_unrepairable(text: str) -> None:
    try:
        out = parse_json(text)
    except Unrepairable:
        return
    assert loads(dumps(out.value)) == out.value  # plain JSON: no NaN, no tuples, no sets; integers whole
