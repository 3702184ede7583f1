"""Repair on pathological answers: linear scanning, hard size and nesting limits, a time budget off the event loop,
and what the client sees when repair gives up (the text as it came, `X-Velo-Repair: skipped=...`)."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from aiohttp.test_utils import TestClient

from adapters.protocol import ChatRequest, Chunk, Message
from proxy.config import Config, ServerConfig, ToolsConfig
from proxy.tools.budget import INLINE_CHARS, Budget
from proxy.tools.calls import CallRepairer, RepairReport
from proxy.tools.repair import MAX_REPAIR_CHARS, Unrepairable, parse_json
from proxy.tools.scan import Brackets
from proxy.tools.stream import HoldBack, repair_message, repair_stream
from proxy.tools.structured import repair_structured
from tests.proxy.tools.test_calls import TOOLS
from tests.scripted import Script, ScriptedBackend

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]
HANG_S = 60  # a hang detector, not a speed goal: before, 2 MB of `{` kept the proxy busy for minutes


def _cut(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.fixture
def config() -> Config:
    return Config(server=ServerConfig(max_body_bytes=64 * 1024))


def test_a_bracket_search_continues_where_it_stopped() -> None:
    text = '{"a": "}\\"", "b": [1, {"c": "]"}]} tail'
    one_shot = Brackets(0).find(text)
    search = Brackets(0)
    for end in range(1, len(text) + 1):
        found = search.find(text[:end])
        if found is not None:
            break
    assert one_shot == found == (text.index(" tail"), text.index(" tail"))


def test_a_held_region_is_not_scanned_again_from_its_start() -> None:
    state = HoldBack(CallRepairer([]))
    state.feed('<tool_call>{"name": "f", "arguments": {"x": "', final=False)
    search = state.search
    for _ in range(100):
        state.feed("yyyyyyyy", final=False)
    assert state.search is search and search.pos > 100 * 8  # type: ignore[union-attr]


def test_deep_nesting_and_huge_text_are_unrepairable_not_crashes() -> None:
    for text in ("{" * 1000, "[" * 32768, '{"a": ' * 300 + "1", "{'a': " * 70 + "1"):
        with pytest.raises(Unrepairable):
            parse_json(text)
    with pytest.raises(Unrepairable, match="more than repair takes"):
        parse_json("{'a': '" + "x" * MAX_REPAIR_CHARS + "'")


def test_a_lone_surrogate_in_the_model_json_is_replaced_not_a_crash() -> None:
    content, calls, _ = repair_message('{"name": "search", "arguments": {"query": "\\ud83d x"}, }', [], TOOLS)
    assert calls[0].arguments == {"query": "\ufffd x"}
    orjson.dumps(calls[0].arguments)  # writable: the dialects can send it


def test_structured_output_too_large_is_passed_through_unrepaired() -> None:
    report = RepairReport()
    text = "{" * (MAX_REPAIR_CHARS + 1)
    assert repair_structured(text, "json", report) == text and report.skipped == ["size"]


async def test_past_the_budget_the_turn_passes_through_unrepaired() -> None:
    # ~48,000 tokens for the fast pass, under the size limit
    broken = "{" + ", ".join(f"'k{i}': {i}" for i in range(12000)) + ",}"
    text = f'<tool_call>{{"name": "search", "arguments": {broken}}}</tool_call>'
    report = RepairReport()

    async def source():
        yield Chunk(text=text)
        yield Chunk(finish_reason="stop")
    with ThreadPoolExecutor(1) as pool:
        out = [c async for c in repair_stream(source(), ChatRequest("m", [Message("user", "x")], tools=TOOLS),
                                              report=report, budget=Budget(0.001, pool))]
    assert "".join(c.text for c in out) == text and not any(c.tool_calls for c in out)
    assert report.skipped == ["budget"] and "skipped=budget" in report.summary()


async def test_large_repair_work_runs_on_a_repair_thread_and_small_work_on_the_loop() -> None:
    """The event loop never does the heavy part (before: 32k characters of `{` froze every client for 5.4 s)."""
    loop_thread = threading.current_thread()
    with ThreadPoolExecutor(1, "velo-repair") as pool:
        budget = Budget(10.0, pool)
        small = await budget.run(threading.current_thread, size=INLINE_CHARS)
        large = await budget.run(threading.current_thread, size=INLINE_CHARS + 1)
    assert small is loop_thread and large is not loop_thread and large.name.startswith("velo-repair")


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=["{" * 32768]))])
async def test_32k_of_open_braces_with_tools_is_answered_as_text(client: TestClient) -> None:
    resp = await asyncio.wait_for(client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": MESSAGES, "tools": [WEATHER]}), HANG_S)
    assert resp.status == 200  # before: 500 (json-repair's own recursion limit), after 4.5 s of a frozen loop
    assert (await resp.json())["choices"][0]["message"]["content"] == "{" * 32768


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=["{" * (2 * 1024 * 1024)]))])
async def test_2mb_of_open_braces_is_passed_through_with_a_header(client: TestClient) -> None:
    for extra in ({"tools": [WEATHER]}, {"response_format": {"type": "json_object"}}):
        resp = await asyncio.wait_for(client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": MESSAGES, **extra}), HANG_S)
        assert resp.status == 200 and resp.headers["X-Velo-Repair"] == "skipped=size"
        assert len((await resp.json())["choices"][0]["message"]["content"]) == 2 * 1024 * 1024
        assert (await client.get("/health")).status == 200


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=_cut("{" * 32768, 16)))])
async def test_32k_of_open_braces_streamed_in_pieces_ends_cleanly(client: TestClient) -> None:
    resp = await asyncio.wait_for(client.post("/api/chat", json={
        "model": "tiny", "messages": MESSAGES, "tools": [WEATHER]}), HANG_S)
    lines = [orjson.loads(line) for line in (await asyncio.wait_for(resp.read(), HANG_S)).splitlines()]
    assert resp.status == 200 and lines[-1]["done"] is True and "error" not in lines[-1]
    assert "".join(line["message"]["content"] for line in lines) == "{" * 32768


@pytest.mark.parametrize("config", [Config(server=ServerConfig(max_body_bytes=64 * 1024),
                                           tools=ToolsConfig(repair_budget_s=0.001))])
@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=[
    '<tool_call>{"name": "get_weather", "arguments": {' + ", ".join(f"'k{i}': {i}" for i in range(12000))
    + ",}}</tool_call>"]))])
async def test_the_budget_header_reaches_the_client(client: TestClient) -> None:
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "tools": [WEATHER],
                                                "stream": False})
    body = await resp.json()
    assert resp.status == 200 and resp.headers["X-Velo-Repair"] == "skipped=budget"
    assert body["message"]["content"].startswith("<tool_call>") and "tool_calls" not in body["message"]


@pytest.mark.parametrize("config", [Config(server=ServerConfig(max_body_bytes=64 * 1024),
                                           tools=ToolsConfig(repair_budget_s=0.001))])
@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=[
    '<tool_call>{"name": "get_weather", "arguments": {' + ", ".join(f"'k{i}': {i}" for i in range(12000))
    + ",}}</tool_call>"]))])
async def test_an_answer_repair_ran_out_of_time_for_is_not_cached(client: TestClient, scripted: ScriptedBackend):
    """Passed through unrepaired because the repair threads were busy (waiting for one counts), an answer is the
    server's load, not the request's: kept, its unrepaired call was replayed as text for the cache's TTL, when an
    idle Velo would have sent the call."""
    ask = {"model": "tiny", "messages": MESSAGES, "tools": [WEATHER], "stream": False, "options": {"temperature": 0}}
    seen = []
    for _ in range(2):
        resp = await client.post("/api/chat", json=ask)
        await resp.read()
        seen.append((resp.headers["X-Velo-Cache"], resp.headers.get("X-Velo-Repair")))
    assert seen == [("miss", "skipped=budget")] * 2 and len(scripted.requests) == 2
