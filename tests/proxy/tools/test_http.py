"""Tool-call and format repair through the real app over HTTP: both dialects, streamed and not, retry, errors."""
from __future__ import annotations

import logging
from typing import Any

import ollama
import openai
import orjson
import pytest
from aiohttp.test_utils import TestClient

from adapters.protocol import ChatRequest
from proxy.config import Config, ServerConfig, ToolsConfig
from proxy.state import GENERATIONS
from proxy.stages.repair import Repair
from tests.scripted import Script, ScriptedBackend

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": "2",}}</tool_call>'
BAD = '{"name": "get_weather", "arguments": {"days": 2}}'
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


class Answers(ScriptedBackend):
    """Answers each request with the next script (the last one repeats): a backend that is wrong first."""

    def __init__(self, *scripts: Script):
        super().__init__(script=scripts[0])
        self.scripts = list(scripts)

    def chat(self, req: ChatRequest):  # type: ignore[override]
        self.script = self.scripts[min(len(self.requests), len(self.scripts) - 1)]
        return super().chat(req)


@pytest.fixture
def config() -> Config:
    return Config(server=ServerConfig(max_body_bytes=64 * 1024), tools=ToolsConfig(max_retries=2))


def _cut(text: str, size: int = 5) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _sse(raw: bytes) -> list[dict[str, Any]]:
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    return [orjson.loads(e) for e in events if e != b"[DONE]"]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=_cut("Let me look. " + CALL)))])
async def test_openai_stream_holds_the_call_and_sends_tool_calls_deltas(client: TestClient) -> None:
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True,
                                                           "tools": [WEATHER]})
    events = _sse(await resp.read())
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    content = "".join(d.get("content") or "" for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert content == "Let me look. "
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
    assert orjson.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 2}  # a string, as OpenAI
    assert calls[0]["id"].startswith("call_") and calls[0]["index"] == 0
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=_cut("Let me look. " + CALL)))])
async def test_ollama_stream_sends_message_tool_calls_with_object_arguments(client: TestClient) -> None:
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "tools": [WEATHER]})
    lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    content = "".join(line["message"]["content"] for line in lines)
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert content == "Let me look. " and "<tool_call>" not in content
    assert [c.pop("id")[:5] for c in calls] == ["call_"]  # repair gives a call from text its id
    assert calls == [{"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]
    assert lines[-1]["done"] is True


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=[CALL]))])
async def test_non_streamed_answer_says_what_was_repaired_in_a_header(client: TestClient) -> None:
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES,
                                                           "tools": [WEATHER]})
    body = await resp.json()
    assert resp.status == 200
    assert body["choices"][0]["finish_reason"] == "tool_calls" and body["choices"][0]["message"]["content"] is None
    header = resp.headers["X-Velo-Repair"]
    assert "extracted=1" in header and "trailing_comma" in header and "coerced=1" in header
    counts = client.server.app[GENERATIONS].current.pipeline.stage(Repair).metrics.snapshot()["tiny"]
    assert counts["extracted"] == 1 and counts["coerced"] == 1 and counts["repaired"] == 1


@pytest.mark.parametrize("scripted", [Answers(Script(pieces=[BAD]), Script(pieces=[CALL]))])
async def test_retry_asks_again_with_the_error_and_returns_the_valid_answer(client: TestClient,
                                                                            scripted: Answers) -> None:
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "tools": [WEATHER],
                                                "stream": False})
    body = await resp.json()
    assert resp.status == 200
    assert body["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "days": 2}
    assert len(scripted.requests) == 2
    again = scripted.requests[1].messages
    assert again[-2].role == "assistant" and again[-2].content == BAD
    assert again[-1].role == "user" and '"city" is a required property' in again[-1].content
    assert "retry=1" in resp.headers["X-Velo-Repair"]
    assert client.server.app[GENERATIONS].current.pipeline.stage(Repair).metrics.snapshot()["tiny"]["retried"] == 1


@pytest.mark.parametrize("scripted", [Answers(Script(pieces=_cut(BAD, 3)), Script(pieces=_cut(CALL, 3)))])
async def test_retry_also_serves_a_streaming_client(client: TestClient, scripted: Answers) -> None:
    resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True,
                                                           "tools": [WEATHER]})
    events = _sse(await resp.read())
    calls = [c for e in events if e["choices"] for c in e["choices"][0]["delta"].get("tool_calls", [])]
    assert [orjson.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris", "days": 2}]
    assert len(scripted.requests) == 2


@pytest.mark.parametrize("scripted", [Answers(Script(pieces=[BAD]))])
async def test_unrepairable_answer_is_a_clear_502_and_nothing_is_cached(client: TestClient,
                                                                       scripted: Answers) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "tools": [WEATHER], "temperature": 0}
    resp = await client.post("/v1/chat/completions", json=body)
    error = (await resp.json())["error"]
    assert resp.status == 502 and error["type"] == "tool_call_invalid"
    assert '"city" is a required property' in error["message"]
    assert len(scripted.requests) == 3  # the answer and max_retries=2 retries
    scripted.scripts = [Script(pieces=[CALL])]
    again = await client.post("/v1/chat/completions", json=body)
    assert again.status == 200 and again.headers["X-Velo-Cache"] == "miss" and len(scripted.requests) == 4
    assert client.server.app[GENERATIONS].current.pipeline.stage(Repair).metrics.snapshot()["tiny"]["invalid"] == 3


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=[BAD]))])
async def test_unrepairable_streamed_answer_is_an_error_status_not_a_broken_stream(client: TestClient) -> None:
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "tools": [WEATHER]})
    assert resp.status == 502 and "city" in (await resp.json())["error"]


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=["Sure! {'name': 'Ada', ", "'age': '36'"]))])
async def test_openai_response_format_json_schema_is_repaired(client: TestClient) -> None:
    resp = await client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": MESSAGES,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}})
    assert resp.status == 200
    assert orjson.loads((await resp.json())["choices"][0]["message"]["content"]) == {"name": "Ada", "age": 36}
    assert "coerced=1" in resp.headers["X-Velo-Repair"]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=['{"name": "Ada",', ' "age": 36,}']))])
async def test_ollama_format_schema_streamed(client: TestClient) -> None:
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "format": SCHEMA})
    lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    assert orjson.loads("".join(line["message"]["content"] for line in lines)) == {"name": "Ada", "age": 36}


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=["I am not able to do that."]))])
async def test_format_json_that_cannot_be_json_is_a_502(client: TestClient) -> None:
    resp = await client.post("/api/generate", json={"model": "tiny", "prompt": "p", "format": "json",
                                                    "stream": False})
    assert resp.status == 502 and "not JSON" in (await resp.json())["error"]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=["plain ", CALL]))])
async def test_repair_off_passes_text_through(client: TestClient) -> None:
    client.server.app[GENERATIONS].current.config.tools.repair = False
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "tools": [WEATHER],
                                                "stream": False})
    body = await resp.json()
    assert body["message"]["content"] == "plain " + CALL and "tool_calls" not in body["message"]
    assert "X-Velo-Repair" not in resp.headers


TWO = CALL + ' then <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=_cut(TWO, 4)))])
async def test_openai_client_stream_accumulates_two_distinct_calls(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    tools = [WEATHER]
    async with client.beta.chat.completions.stream(model="tiny", messages=MESSAGES, tools=tools) as stream:
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [orjson.loads(c.function.arguments) for c in calls] == [{"city": "Paris", "days": 2}, {"city": "Rome"}]
    assert len({c.id for c in calls}) == 2 and final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=_cut(TWO, 4)))])
async def test_ollama_client_stream_gets_both_calls(base_url: str) -> None:
    parts = [p async for p in await ollama.AsyncClient(host=base_url).chat(
        model="tiny", messages=MESSAGES, tools=[WEATHER], stream=True)]
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Rome"})]
    assert "".join(p.message.content or "" for p in parts) == " then "


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=_cut(CALL)))])
async def test_streamed_repairs_are_logged(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="velo.tools")
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "tools": [WEATHER]})
    await resp.read()
    assert any("repair for tiny" in r.message and "trailing_comma" in r.message for r in caplog.records)


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=["I am not able to do that."]))])
async def test_an_sdk_does_not_retry_a_greedy_answer_that_stays_invalid(base_url: str,
                                                                        scripted: ScriptedBackend) -> None:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=2)
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0,
                                             response_format={"type": "json_object"})
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(scripted.requests) == 3  # Velo's own max_retries=2, and not the SDK's 2 retries of it


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=[BAD]))])
@pytest.mark.parametrize("path, body, retried", [
    ("/v1/messages", {"max_tokens": 64, "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]
                                                   ["parameters"]}], "temperature": 0}, "false"),
    ("/v1/chat/completions", {"tools": [WEATHER], "seed": 7}, "false"),
    ("/v1/chat/completions", {"tools": [WEATHER], "temperature": 0.7}, None),
])
async def test_only_a_repeatable_failure_tells_the_client_not_to_retry(client: TestClient, path: str,
                                                                       body: dict[str, Any],
                                                                       retried: str | None) -> None:
    resp = await client.post(path, json={"model": "tiny", "messages": MESSAGES, **body})
    assert resp.status >= 500
    assert resp.headers.get("x-should-retry") == retried


UNUSABLE = [{"$ref": "#/definitions/Missing"}, {"type": 5}, {"$ref": "https://example.com/city.json"}]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=[CALL]))])
@pytest.mark.parametrize("city", UNUSABLE)
async def test_a_tool_whose_schema_cannot_be_used_has_its_calls_passed_on_as_written(client: TestClient, city) -> None:
    """A client's dangling or remote `$ref`, or a type of 5: nothing to check a call against, so it goes out as
    the model wrote it (repaired JSON), as Ollama passes it; every call to such a tool was a 502, which SDKs retry."""
    tool = {"type": "function", "function": {**WEATHER["function"], "parameters": {
        "type": "object", "properties": {"city": city, "days": {"type": "integer"}}}}}
    for path, body in (("/v1/chat/completions", {}), ("/api/chat", {"stream": False})):
        resp = await client.post(path, json={"model": "tiny", "messages": MESSAGES, "tools": [tool], **body})
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
        calls = answer["choices"][0]["message"]["tool_calls"] if path.startswith("/v1") else \
            answer["message"]["tool_calls"]
        assert calls[0]["function"]["name"] == "get_weather" and "skipped=schema" in resp.headers["X-Velo-Repair"]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(pieces=['{"city": "Paris",}']))])
async def test_a_format_whose_schema_cannot_be_used_is_answered_as_json_unchecked(client: TestClient) -> None:
    schema = {"type": "object", "properties": {"city": UNUSABLE[0]}}
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "format": schema,
                                                "stream": False})
    assert resp.status == 200, await resp.text()
    assert orjson.loads((await resp.json())["message"]["content"]) == {"city": "Paris"}
    assert "skipped=schema" in resp.headers["X-Velo-Repair"]
