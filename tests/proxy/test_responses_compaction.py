"""Codex's remote compaction through the Responses API: v2 (a `compaction_trigger` ending the input of
`POST /v1/responses`, streamed as Codex reads it) and v1 (`POST /v1/responses/compact` through the official `openai`
package), the compaction item sent back in place of the history, and a conversation too long for the context."""
from __future__ import annotations

import openai
import orjson
import pytest

from proxy.dialects.responses import COMPACTED, SUMMARIZE
from tests.scripted import ScriptedBackend

from .test_responses_dialect import sse_events

TURNS = [
    {"role": "user", "content": "Fix the failing test in a.py"},
    {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "pytest"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "1 failed"},
    {"role": "assistant", "content": "The assert in a.py is off by one."},
]
TRIGGER = {"type": "compaction_trigger"}


def _summary(item: dict) -> str:
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    return orjson.loads(item["encrypted_content"])["summary"]


async def test_a_trigger_streams_exactly_one_compaction_item(client, scripted: ScriptedBackend):
    """What Codex's compaction v2 counts on: one compaction item in `response.output_item.done`, then
    `response.completed`; the model was asked for a summary of the conversation, with no tools and greedily."""
    resp = await client.post("/v1/responses", json={
        "model": "tiny", "instructions": "You are Codex.", "input": TURNS + [TRIGGER], "stream": True,
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]})
    events = sse_events(await resp.text())
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert names.count("response.compaction.compacting") == 3  # one per piece the model wrote
    done = [e["item"] for name, e in events if name == "response.output_item.done"]
    assert len(done) == 1 and _summary(done[0]) == "Hello world"
    assert events[-1][1]["response"]["output"] == done and events[-1][1]["response"]["status"] == "completed"
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    req = scripted.requests[0]
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert req.messages[-1].content == SUMMARIZE and req.tools == [] and req.think is False
    assert (req.options.temperature, req.options.repeat_penalty, req.options.max_tokens) == (0, 1.1, 1024)


async def test_the_compaction_item_comes_back_as_the_summary(client, scripted: ScriptedBackend):
    """Codex sends the item back in place of the history: the model reads the summary as a user turn."""
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": TURNS + [TRIGGER]})
    [item] = (await resp.json())["output"]
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": [
        {"role": "user", "content": "Fix the failing test in a.py"}, item, {"role": "user", "content": "Go on"}]})
    assert resp.status == 200
    assert [(m.role, m.content) for m in scripted.requests[-1].messages] == [
        ("user", "Fix the failing test in a.py"), ("user", COMPACTED + "Hello world"), ("user", "Go on")]


async def test_a_stored_compaction_continued_by_id_stands_for_the_turns_before_it(client, scripted):
    """Chained with previous_response_id, the compacted response's history is what the compaction stands for: the
    user's messages stay, the tool calls and answers go."""
    first = await (await client.post("/v1/responses", json={"model": "tiny", "input": TURNS})).json()
    compacted = await (await client.post("/v1/responses", json={
        "model": "tiny", "previous_response_id": first["id"], "input": [TRIGGER]})).json()
    assert compacted["output"][0]["type"] == "compaction"
    resp = await client.post("/v1/responses", json={"model": "tiny", "previous_response_id": compacted["id"],
                                                    "input": "Go on"})
    assert resp.status == 200
    assert [(m.role, m.content) for m in scripted.requests[-1].messages] == [
        ("user", "Fix the failing test in a.py"), ("user", COMPACTED + "Hello world"), ("user", "Go on")]


async def test_compact_answers_the_user_messages_and_one_compaction_item(base_url, scripted: ScriptedBackend):
    """v1, through the SDK's `responses.compact`: OpenAI's shape, every user message then the compaction item."""
    out = await openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="k", max_retries=0).responses.compact(
        model="tiny", input=TURNS)
    assert out.object == "response.compaction" and out.usage.output_tokens == 3
    assert [(i.type, getattr(i, "role", None)) for i in out.output] == [("message", "user"), ("compaction", None)]
    user = out.output[0].model_dump()
    assert user["id"].startswith("msg_") and user["status"] == "completed"  # an output message's fields
    assert [(p["type"], p["text"]) for p in user["content"]] == [("input_text", "Fix the failing test in a.py")]
    assert _summary(out.output[-1].model_dump()) == "Hello world"


async def test_a_conversation_too_long_for_the_context_is_still_compacted(client, scripted: ScriptedBackend):
    """Compaction is asked for when the conversation has outgrown the context: a turn that gets the 400 Codex knows
    is compacted from its latest turns, and says what it dropped."""
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 400} for i in range(30)]
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": long})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "context_length_exceeded"
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": long + [TRIGGER]})
    assert resp.status == 200 and "messages" in resp.headers["X-Velo-Context-Trimmed"]
    assert _summary((await resp.json())["output"][0]) == "Hello world"
    assert scripted.requests[-1].messages[-1].content == SUMMARIZE


async def test_a_model_that_writes_no_summary_fails_the_compaction(client, scripted: ScriptedBackend):
    scripted.script.pieces = [""]
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": TURNS + [TRIGGER], "stream": True})
    name, event = sse_events(await resp.text())[-1]
    assert name == "response.failed" and "no summary" in event["response"]["error"]["message"]
    resp = await client.post("/v1/responses/compact", json={"model": "tiny", "input": TURNS})
    assert resp.status == 502 and "no summary" in (await resp.json())["error"]["message"]


@pytest.mark.parametrize("input_, message", [
    ([TRIGGER, {"role": "user", "content": "hi"}], "must be the last input item"),
    ([{"type": "compaction", "encrypted_content": "gAAAAB-openai-encrypted"}], "Velo did not make"),
    ([{"type": "compaction", "encrypted_content": '{"type": "ollama_compaction"}'}], "Velo did not make"),
])
async def test_foreign_or_misplaced_compaction_items_are_400s(client, scripted, input_, message):
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": input_})
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["param"] == "input" and message in error["message"]
    assert scripted.requests == []


async def test_the_sdk_parses_a_compaction_stream(base_url):
    """The official client's stream reads every event of a v2 compaction, the compaction item included."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="k", max_retries=0)
    stream = await client.responses.create(model="tiny", input=TURNS + [TRIGGER], stream=True)
    events = [event async for event in stream]
    assert type(events[2]).__name__ == "ResponseCompactionCompactingEvent"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [type(item).__name__ for item in done] == ["ResponseCompactionItem"]
    assert events[-1].type == "response.completed" and events[-1].response.output[0].type == "compaction"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_summary_cut_by_its_limit_says_so(client, scripted: ScriptedBackend, stream: bool):
    """A cut summary was "completed", with nothing marking it cut, and the client put it in place of its history."""
    scripted.script.finish_reason = "length"
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": TURNS + [TRIGGER], "stream": stream,
                                                    "max_output_tokens": 16})
    final = sse_events(await resp.text())[-1][1]["response"] if stream else await resp.json()
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert _summary(final["output"][0]) == "Hello world"
