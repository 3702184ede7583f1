"""Real outputs of the shipped SmolLM2-135M asked to call tools (tests/data/tool_transcripts.jsonl, captured once by
tests/data/tool_transcripts_capture.py from llama-server), with what Velo must make of each, set by hand.

A 135M model answers plain requests with prose (which must stay untouched: nothing is invented from it) and, when
its turn is started with <tool_call>, writes broken attempts: each must be refused with the reason, never passed
on as a call.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.protocol import Tool
from proxy.tools.calls import ToolCallInvalid
from proxy.tools.stream import repair_message

RECORDS = [json.loads(line) for line in
           (Path(__file__).parents[2] / "data" / "tool_transcripts.jsonl").read_text().splitlines()]
NO_CALL = "no parsable call after <tool_call>"
# line -> the ToolCallInvalid message expected, or None: prose kept as it is, no call
EXPECTED: dict[int, str | None] = {i: None for i in range(12)} | {
    12: NO_CALL,  # a quoted string, no JSON object
    13: NO_CALL,  # prose with a cut-off {"name": "Paris", ...} that names no function
    14: '"city" is a required property',  # get_weather with the schema echoed as its "parameters"
    15: NO_CALL,  # Python code
    16: '"query" is a required property',  # search with a "description" and no arguments
    18: NO_CALL,  # Python code in a docstring
    19: NO_CALL,  # GET {"url": ...}
    20: NO_CALL,  # {"location", "description", "parameters"}: no name
    21: NO_CALL,  # JavaScript
}


def _tools(record: dict) -> list[Tool]:
    return [Tool(t["name"], t["description"], t["parameters"]) for t in record["tools"]]


def test_every_transcript_has_an_expectation() -> None:
    assert set(EXPECTED) | {17} == set(range(len(RECORDS)))


@pytest.mark.parametrize("line", [i for i, e in EXPECTED.items() if e is None])
def test_prose_answers_stay_untouched(line: int) -> None:
    record = RECORDS[line]
    content, calls, report = repair_message(record["output"], [], _tools(record))
    assert content == record["output"].strip() and calls == [] and not report.changed


@pytest.mark.parametrize("line", [i for i, e in EXPECTED.items() if e is not None])
def test_broken_attempts_are_refused_with_the_reason(line: int) -> None:
    record = RECORDS[line]
    with pytest.raises(ToolCallInvalid) as caught:
        repair_message(record["output"], [], _tools(record))
    assert EXPECTED[line] in caught.value.message


def test_an_attempt_followed_by_prose_keeps_the_prose_and_reports_the_attempt() -> None:
    record = RECORDS[17]  # <tool_call># 3: 3.12...</tool_call> then an explanation
    content, calls, report = repair_message(record["output"], [], _tools(record))
    assert calls == [] and content == record["output"].strip() and report.invalid == [NO_CALL]
