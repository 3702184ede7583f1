"""The schema of one call of a request's tools: each tool's definitions move to the root under its own names."""
from __future__ import annotations

import jsonschema
import pytest

from engine.grammar import grammar_for
from engine.tool_schema import tool_call_schema
from tests.engine.test_constrained import FORECAST, MEASURE, WEATHER


def test_definitions_move_to_the_root_and_their_refs_follow():
    """Inside the wrapper, `#/$defs/Unit` pointed at the root, which held none: instructor's response models and
    pydantic-ai's tools with an Enum or a nested model were a 400 on every turn."""
    schema = tool_call_schema([FORECAST, MEASURE, WEATHER])
    assert set(schema["$defs"]) == {"t0.Unit", "t1.Unit"}
    assert "$defs" not in str(schema["anyOf"]).replace("#/$defs/", "") and "definitions" not in str(schema)
    check = jsonschema.Draft202012Validator(schema)
    for good in ({"name": "forecast", "arguments": {"unit": "C"}}, {"name": "measure", "arguments": {"unit": "cm"}},
                 {"name": "get_weather", "arguments": {"city": "Paris"}}):
        check.validate(good)
    for bad in ({"name": "forecast", "arguments": {"unit": "cm"}}, {"name": "measure", "arguments": {"unit": "C"}}):
        with pytest.raises(jsonschema.ValidationError):
            check.validate(bad)


def test_a_tool_without_definitions_is_wrapped_as_it_is():
    schema = tool_call_schema([WEATHER, {"name": "bare"}])
    assert "$defs" not in schema and schema["anyOf"][0]["properties"]["arguments"] is WEATHER["parameters"]
    assert schema["anyOf"][1]["properties"]["arguments"] == {"type": "object"}


def test_a_schema_whose_refs_point_into_itself_moves_whole_and_its_refs_follow():
    """`#` (a recursive tree) meant the call inside the wrapper, so a tree's children had to be calls, and
    `#/properties/a` named nothing there (a 400)."""
    tree = {"type": "object", "properties": {"name": {"type": "string"}, "kids": {"type": "array", "items": {
        "$ref": "#"}}}, "required": ["name"], "additionalProperties": False}
    alias = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}}
    check = jsonschema.Draft202012Validator(tool_call_schema([{"name": "tree", "parameters": tree},
                                                              {"name": "alias", "parameters": alias}]))
    check.validate({"name": "tree", "arguments": {"name": "a", "kids": [{"name": "b", "kids": []}]}})
    check.validate({"name": "alias", "arguments": {"a": 1, "b": 2}})
    for bad in ({"name": "tree", "arguments": {"name": "a", "kids": [{"name": "tree", "arguments": {"name": "b"}}]}},
                {"name": "alias", "arguments": {"a": 1, "b": "two"}}):
        with pytest.raises(jsonschema.ValidationError):
            check.validate(bad)


def test_what_moves_loses_its_id_whose_refs_would_resolve_against_it():
    """A tool with an `$id` (TypeBox's, a published schema's) kept it inside the wrapper, where `#/$defs/t0.City`
    resolved against that `$id`, which held no definitions: the engine's grammar was a 400 ("Pointer ... does not
    exist") for every request offering the tool."""
    place = {"$id": "https://example.com/place.json", "type": "object", "additionalProperties": False,
             "$defs": {"City": {"$id": "city.json", "type": "string", "maxLength": 12}},
             "properties": {"city": {"$ref": "#/$defs/City"}}, "required": ["city"]}
    grammar_for(None, [{"name": "place", "parameters": place}], "required")
    schema = tool_call_schema([{"name": "place", "parameters": place}])
    check = jsonschema.Draft202012Validator(schema)
    check.validate({"name": "place", "arguments": {"city": "Rome"}})
    with pytest.raises(jsonschema.ValidationError):
        check.validate({"name": "place", "arguments": {"city": "Rome, the eternal city"}})
