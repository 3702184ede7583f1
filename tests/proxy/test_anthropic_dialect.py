"""The Anthropic Messages API under /v1/messages, driven by the official `anthropic` package (messages, streaming
helpers, tools, count_tokens) plus raw-wire checks of the events and error shapes Claude Code relies on."""
from __future__ import annotations

import dataclasses
import re

import anthropic
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.chat_template import message_dict
from adapters.errors import BackendTimeout, BackendUnavailable
from adapters.protocol import Chunk, ModelInfo, ToolCall, Usage
from proxy.app import make_app
from proxy.config import Config, ModelConfig, ServerConfig
from proxy import context_edits
from proxy.dialects import anthropic as anthropic_dialect
from engine.chat_jinja import chat_template_env
from proxy.token_count import estimate
from tests.scripted import Script, ScriptedBackend

USER = [{"role": "user", "content": "hi"}]
READ = {"name": "read_file", "description": "Read a file", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


def _client(base_url: str, **kw) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-ant-test", max_retries=0, **kw)


def sse_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in filter(None, text.split("\n\n")):
        name, data = block.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: "), block
        out.append((name[7:], orjson.loads(data[6:])))
    return out


async def test_message_with_text_and_tool_use(base_url, scripted: ScriptedBackend):
    scripted.script.tool_calls = [ToolCall("read_file", {"path": "a.py"}, "toolu_1")]
    msg = await _client(base_url).messages.create(model="tiny", max_tokens=64, messages=USER, tools=[READ])
    assert msg.id.startswith("msg_") and msg.role == "assistant" and msg.model == "tiny"
    assert [b.type for b in msg.content] == ["text", "tool_use"] and msg.content[0].text == "Hello world"
    assert (msg.content[1].id, msg.content[1].name, msg.content[1].input) == ("toolu_1", "read_file", {"path": "a.py"})
    assert msg.stop_reason == "tool_use" and msg.stop_sequence is None
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (5, 3)
    req = scripted.requests[0]
    assert req.tools[0].name == "read_file" and req.tools[0].parameters == READ["input_schema"]
    assert req.options.max_tokens == 64


async def test_stream_events_in_anthropics_order(client, scripted: ScriptedBackend):
    scripted.script.thinking = "Let me think."
    scripted.script.tool_calls = [ToolCall("read_file", {"path": "a.py"}, "toolu_1")]
    resp = await client.post("/v1/messages?beta=true", json={"model": "tiny", "max_tokens": 64, "stream": True,
                                                             "messages": USER, "tools": [READ]})
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    events = sse_events(await resp.text())
    assert [e for e, _ in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  # thinking
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
        "content_block_stop",  # text, a delta per piece
        "content_block_start", "content_block_delta", "content_block_stop",  # tool_use
        "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    starts = [d["content_block"] for e, d in events if e == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"]
    assert starts[2] == {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}
    deltas = [d["delta"] for e, d in events if e == "content_block_delta"]
    assert deltas[0] == {"type": "thinking_delta", "thinking": "Let me think."}
    assert deltas[1] == {"type": "signature_delta", "signature": ""}  # the AI SDK reads a block's signature here
    assert deltas[-1] == {"type": "input_json_delta", "partial_json": '{"path":"a.py"}'}
    assert [d["index"] for e, d in events if e.startswith("content_block")] == [0] * 4 + [1] * 5 + [2] * 3
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 3 and delta["usage"]["input_tokens"] == 5
    # message_start's input tokens: an estimate before the backend's count (was 0), as Ollama's Anthropic API sends
    assert events[0][1]["message"]["usage"]["input_tokens"] == estimate(anthropic_dialect.parse_messages(
        {"model": "tiny", "max_tokens": 64, "messages": USER, "tools": [READ]}).request) > 0


async def test_streaming_helper_accumulates_the_same_message(base_url, scripted: ScriptedBackend):
    scripted.script.thinking = "Hmm."
    async with _client(base_url).messages.stream(model="tiny", max_tokens=64, messages=USER) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Hello world"
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == "Hmm."
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3


async def test_claude_codes_billing_block_is_left_out_so_each_turn_extends_the_last(client, scripted: ScriptedBackend):
    """Claude Code's first system block carries a hash that changes every request; left in, each turn's prompt
    differed from the last at its 38th token and no prefix cache reused the rest (32 of 2,300 tokens cached)."""
    async def turn(cch: str) -> None:
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; "
                                           f"cch={cch};"},
                  {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
        resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "system": system,
                                                       "messages": USER})
        assert resp.status == 200, await resp.text()
    await turn("fa690")
    await turn("65abc")
    assert [[(m.role, m.content) for m in r.messages] for r in scripted.requests] == \
        [[("system", "You are Claude Code."), ("user", "hi")]] * 2


def test_a_billing_header_joined_to_the_prompt_leaves_the_prompt():
    """A client that joins the system blocks, or sends the system as one string, keeps the text after the header's
    fields (llama.cpp's example of the header is such a joined block)."""
    header = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;"
    for system in (header + "You are Claude Code.", [{"type": "text", "text": header + "\nYou are Claude Code."}]):
        parsed = anthropic_dialect.parse_messages({"model": "m", "max_tokens": 8, "system": system, "messages": USER})
        assert [(m.role, m.content) for m in parsed.request.messages][0] == ("system", "You are Claude Code.")
    kept = "Quote this: x-anthropic-billing-header: a=b;"
    parsed = anthropic_dialect.parse_messages({"model": "m", "max_tokens": 8, "system": kept, "messages": USER})
    assert parsed.request.messages[0].content == kept


async def test_a_claude_code_turn_converts_to_the_internal_conversation(client, scripted: ScriptedBackend):
    """System blocks with cache_control, a system message inside messages, a tool round trip with string and block
    results, an error result, thinking echoed back, an image, adaptive thinking: as Claude Code sends them."""
    body = {"model": "claude-sonnet-4", "max_tokens": 32000, "stream": False,
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": "Be brief."}],
            "thinking": {"type": "adaptive"}, "metadata": {"user_id": "u"}, "output_config": {"effort": "high"},
            "context_management": {"edits": []}, "tools": [READ],
            "messages": [
                {"role": "system", "content": "Reminder."},
                {"role": "user", "content": [{"type": "text", "text": "Read a.py"},
                                             {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                          "data": "QUJD"}}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should read it.", "signature": "sig"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "b.py"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1\tprint(1)",
                     "cache_control": {"type": "ephemeral"}},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                     "content": [{"type": "text", "text": "no such file"}]},
                    {"type": "text", "text": "Go on."}]}]}
    resp = await client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01",
                                                               "anthropic-beta": "claude-code-20250219"})
    assert resp.status == 200, await resp.text()
    req = scripted.requests[0]
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "You are Claude Code.\nBe brief.\n\nReminder."), ("user", "Read a.py"),
        ("assistant", "Reading."), ("tool", "1\tprint(1)"), ("tool", "Error: no such file"), ("user", "Go on.")]
    assert req.messages[1].images == ["QUJD"] and req.messages[2].thinking == "I should read it."
    assert [(c.id, c.arguments) for c in req.messages[2].tool_calls] == [("toolu_1", {"path": "a.py"}),
                                                                        ("toolu_2", {"path": "b.py"})]
    assert [(m.tool_call_id, m.tool_name) for m in req.messages[3:5]] == [("toolu_1", "read_file"),
                                                                         ("toolu_2", "read_file")]
    assert req.think is None and req.options.max_tokens == 32000


async def test_plain_text_documents_become_text_of_the_turn(client, scripted: ScriptedBackend):
    """A `text` or `content` document reads as text (title and context first) apart from the text around it; a
    source with no data is a 400 naming the block, not dropped (Ollama drops every document without a word). PDFs:
    test_documents.py."""
    doc = {"type": "document", "title": "notes.txt", "source": {"type": "text", "media_type": "text/plain",
                                                                 "data": "Velo listens on 8000."}}
    parts = {"type": "document", "context": "From the README", "citations": {"enabled": True},
             "source": {"type": "content", "content": [{"type": "text", "text": "Port 8000."}]}}
    body = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": [doc, parts, {"type": "text", "text": "Which port?"}]}]}
    assert (await client.post("/v1/messages", json=body)).status == 200
    assert scripted.requests[0].messages[0].content == \
        "notes.txt\n\nVelo listens on 8000.\n\nFrom the README\n\nPort 8000.\n\nWhich port?"
    after = {**body, "messages": [{"role": "user", "content": [{"type": "text", "text": "Read this:"}, doc]}]}
    assert (await client.post("/v1/messages", json=after)).status == 200  # was "Read this:notes.txt ..."
    assert scripted.requests[1].messages[0].content == "Read this:\n\nnotes.txt\n\nVelo listens on 8000.\n\n"
    broken = {**doc, "source": {"type": "base64"}}
    resp = await client.post("/v1/messages", json={**body, "messages": [{"role": "user", "content": [broken]}]})
    error = (await resp.json())["error"]
    assert resp.status == 400 and "messages.0.content.0.source" in error["message"]


async def test_tool_results_read_documents_search_results_and_tool_references(client, scripted):
    """Blocks Anthropic takes in a tool result (tool search answers with tool references); before, a 400."""
    body = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "look", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "document", "title": "a.txt", "source": {"type": "text", "media_type": "text/plain",
                                                               "data": "alpha"}},
            {"type": "search_result", "source": "https://x.org/b", "title": "B",
             "content": [{"type": "text", "text": "beta"}]},
            {"type": "tool_reference", "tool_name": "get_weather"}]}]}]}
    assert (await client.post("/v1/messages", json=body)).status == 200
    result = scripted.requests[0].messages[1]
    assert (result.role, result.content) == ("tool", "a.txt\n\nalpha\nB\nhttps://x.org/b\nbeta\nTool: get_weather")


async def test_search_results_in_a_user_turn_read_as_text_of_the_turn(client, scripted):
    """A `search_result` block is user content too (Anthropic's search results, as the SDK's ContentBlockParam has
    it), read as a tool result reads it, apart from the text around it; it was a 400 "not supported"."""
    result = {"type": "search_result", "source": "https://x.org/b", "title": "B", "citations": {"enabled": True},
              "content": [{"type": "text", "text": "beta"}]}
    body = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Given:"}, result, {"type": "text", "text": "What?"}]}]}
    resp = await client.post("/v1/messages", json=body)
    assert resp.status == 200, await resp.text()
    assert scripted.requests[0].messages[0].content == "Given:\n\nB\nhttps://x.org/b\nbeta\n\nWhat?"


async def test_consecutive_turns_of_one_role_are_combined_as_anthropic_combines_them(client, scripted):
    """Anthropic's API combines consecutive user or assistant turns into one; passed on apart, a chat template that
    wants the roles to alternate (Gemma's, Mistral's) refused the request."""
    body = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Read this."},
        {"role": "user", "content": [{"type": "text", "text": "Then answer."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "look", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "seen"},
                                     {"type": "text", "text": "Go on."}]},
        {"role": "user", "content": "Briefly."},
        {"role": "assistant", "content": "Sure"},
        {"role": "assistant", "content": [{"type": "text", "text": ", here"}]}]}
    assert (await client.post("/v1/messages", json=body)).status == 200
    sent = [(m.role, m.content, [c.name for c in m.tool_calls]) for m in scripted.requests[0].messages]
    assert sent == [("user", "Read this.\n\nThen answer.", []), ("assistant", "", ["look"]), ("tool", "seen", []),
                    ("user", "Go on.\n\nBriefly.", []), ("assistant", "Sure, here", [])]


# The rule of Gemma's and Mistral's chat templates: after the system prompt, user and assistant turns alternate.
ALTERNATING = ("{% set turns = messages[1:] if messages[0]['role'] == 'system' else messages %}"
               "{% for m in turns %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
               "{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")


async def test_system_messages_inside_messages_are_the_system_prompt_or_user_text_where_they_stand(client, scripted):
    """Claude Code (2.1.154 and later) sends its reminders as `role: "system"` messages after a user turn or a tool
    result, one more each turn. Passed on as system turns, every such request was a 400 from a template that wants
    the roles to alternate (llama-server's and the engine's "Conversation roles must alternate"); in the system
    prompt they would change the prompt ahead of the whole conversation each turn, so they stay where they stand."""
    body = {"model": "tiny", "max_tokens": 8, "system": "You are Claude Code.", "messages": [
        {"role": "system", "content": "Ahead of it all."},
        {"role": "user", "content": "Read a.py"},
        {"role": "system", "content": [{"type": "text", "text": "<reminder 1>"}]},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Thanks"},
        {"role": "system", "content": "<reminder 2>"}]}
    resp = await client.post("/v1/messages", json=body)
    assert resp.status == 200, await resp.text()
    sent = scripted.requests[0].messages
    assert [(m.role, m.content) for m in sent] == [
        ("system", "You are Claude Code.\n\nAhead of it all."), ("user", "Read a.py\n\n<reminder 1>"),
        ("assistant", "Done."), ("user", "Thanks\n\n<reminder 2>")]
    chat_template_env().from_string(ALTERNATING).render(messages=[message_dict(m) for m in sent])


def test_a_long_run_of_one_roles_turns_is_combined_with_one_copy(monkeypatch):
    """A run of turns was combined by adding each to the one before, copying the text so far every time: 100,000
    one-word user turns (3.4 MB) held the event loop for 2.5 s, a body at the 32 MB limit for minutes. Counted, not
    timed: the run is copied once, whatever its length, and reads as the turns joined."""
    copies = []
    monkeypatch.setattr(anthropic_dialect, "replace", lambda m, **kw: copies.append(kw) or dataclasses.replace(m, **kw))
    turns = 1_000
    parsed = anthropic_dialect.parse_messages({"model": "m", "max_tokens": 8,
                                               "messages": [{"role": "user", "content": "a"}] * turns})
    assert [m.content for m in parsed.request.messages if m.role == "user"] == ["\n\n".join(["a"] * turns)]
    assert len([c for c in copies if "content" in c]) == 1


async def test_a_server_tools_call_and_result_stay_in_the_history(client, scripted):
    """A history from Anthropic's API (or Ollama's) with a web search it ran: the call, then its result, as Ollama
    reads them; before, a 400."""
    search = [{"type": "web_search_result", "title": "Velo", "url": "https://velo.dev", "encrypted_content": "x"}]
    body = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Find Velo"},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"query": "velo"}},
            {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": search},
            {"type": "text", "text": "Found it."}]},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srv_2", "name": "web_search", "input": {"query": "x"}},
            {"type": "web_search_tool_result", "tool_use_id": "srv_2",
             "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"}}]},
        {"role": "user", "content": "Thanks"}]}
    assert (await client.post("/v1/messages", json=body)).status == 200
    got = [(m.role, m.content, [c.name for c in m.tool_calls]) for m in scripted.requests[0].messages]
    assert got == [("user", "Find Velo", []), ("assistant", "Found it.", ["web_search"]),
                   ("tool", "- Velo: https://velo.dev\n", []), ("assistant", "", ["web_search"]),
                   ("tool", "web_search_tool_result_error: max_uses_exceeded", []), ("user", "Thanks", [])]


async def test_an_mcp_connector_call_and_result_stay_in_the_history(client, scripted):
    """A history from Anthropic's MCP connector (beta mcp-client): its call and its result (text blocks, as a tool
    result's) read as a call and its result; the call was a 400 "not supported" while its result was taken, as JSON."""
    body = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Which issues are open?"},
        {"role": "assistant", "content": [
            {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "list_issues", "server_name": "github",
             "input": {"state": "open"}},
            {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": False,
             "content": [{"type": "text", "text": "#12 crash on start"}]}]},
        {"role": "user", "content": "Thanks"}]}
    resp = await client.post("/v1/messages", json=body)
    assert resp.status == 200, await resp.text()
    got = [(m.role, m.content, [c.name for c in m.tool_calls]) for m in scripted.requests[0].messages]
    assert got == [("user", "Which issues are open?", []), ("assistant", "", ["list_issues"]),
                   ("tool", "#12 crash on start", []), ("user", "Thanks", [])]


@pytest.mark.parametrize("choice, internal", [
    ({"type": "auto"}, None), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "read_file"}, {"type": "function", "function": {"name": "read_file"}})])
async def test_tool_choice_maps_to_the_internal_form(client, scripted, choice, internal):
    resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER,
                                                   "tools": [READ], "tool_choice": choice})
    assert resp.status == 200 and scripted.requests[0].tool_choice == internal


@pytest.mark.parametrize("thinking, think", [
    ({"type": "enabled", "budget_tokens": 1024}, True), ({"type": "disabled"}, False), ({"type": "adaptive"}, None)])
async def test_thinking_switch_reaches_the_request(client, scripted, thinking, think):
    resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER,
                                                   "thinking": thinking})
    assert resp.status == 200 and scripted.requests[0].think == think


async def test_sampling_fields_and_structured_output(client, scripted):
    scripted.script.pieces = ['{"a": 1}']
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    resp = await client.post("/v1/messages", json={
        "model": "tiny", "max_tokens": 8, "messages": USER, "temperature": 0.2, "top_p": 0.5, "top_k": 7,
        "stop_sequences": ["END"], "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert resp.status == 200
    o, req = scripted.requests[0].options, scripted.requests[0]
    assert (o.temperature, o.top_p, o.top_k, o.stop, req.format) == (0.2, 0.5, 7, ["END"], schema)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_format_no_output_can_match_is_a_400_naming_output_config_format(client, scripted, stream):
    """Anthropic's error has no `param`: its message names the field, as the dialect's own checks do. It said
    "invalid output grammar: Unsatisfiable schema: ..." and left the client to guess which part of the request."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 5, "maxLength": 2}},
              "required": ["s"]}
    resp = await client.post("/v1/messages", json={
        "model": "tiny", "max_tokens": 8, "messages": USER, "stream": stream,
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["type"] == "invalid_request_error" and scripted.requests == []
    assert error["message"].startswith("output_config.format: ") and "Unsatisfiable schema" in error["message"]


async def test_server_tools_are_left_out_and_named(client, scripted):
    resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER, "tools": [
        READ, {"type": "web_search_20250305", "name": "web_search"}]})
    assert resp.status == 200 and resp.headers["X-Velo-Tools-Ignored"] == "web_search"
    assert [t.name for t in scripted.requests[0].tools] == ["read_file"]
    resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER, "mcp_servers": [
        {"type": "url", "url": "https://mcp.example.com/sse", "name": "docs"}]})  # the beta MCP connector
    assert resp.status == 200 and resp.headers["X-Velo-Tools-Ignored"] == "mcp_servers.docs"
    for stream in (False, True):  # a line break in a name would end the header: aiohttp refused it, a 500
        resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER,
                                                       "stream": stream, "tools": [
                                                           {"type": "web_search_20250305", "name": "a\r\nX-B: 1"}]})
        assert resp.status == 200 and resp.headers["X-Velo-Tools-Ignored"] == "a  X-B: 1" and "X-B" not in resp.headers
    resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER,
                                                   "mcp_servers": ["docs"]})
    assert resp.status == 400 and (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_anthropics_client_tools_are_offered_with_their_documented_schemas(client, scripted):
    """bash, the text editor and memory run on the client: the model is told their schemas (Claude knows them), so a
    call to one can be forced; before, they were left out like server tools. Computer use still is."""
    tools = [{"type": "bash_20250124", "name": "bash"},
             {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool", "max_characters": 10000},
             {"type": "text_editor_20250124", "name": "str_replace_editor"},
             {"type": "memory_20250818", "name": "memory"},
             {"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768}]
    forced = {"type": "tool", "name": "str_replace_based_edit_tool"}
    body = {"model": "tiny", "max_tokens": 8, "messages": USER, "tools": tools, "tool_choice": forced}
    resp = await client.post("/v1/messages", json=body)
    assert resp.status == 200 and resp.headers["X-Velo-Tools-Ignored"] == "computer"
    assert [t.name for t in scripted.requests[0].tools] == ["str_replace_based_edit_tool"]  # the one forced
    offered = {t.name: t.parameters for t in anthropic_dialect.parse_messages(body).request.tools}
    assert list(offered) == ["bash", "str_replace_based_edit_tool", "str_replace_editor", "memory"]
    assert offered["str_replace_based_edit_tool"]["properties"]["command"]["enum"] == [
        "view", "create", "str_replace", "insert"]  # undo_edit went with Claude 4's tool version
    assert "undo_edit" in offered["str_replace_editor"]["properties"]["command"]["enum"]
    assert offered["str_replace_based_edit_tool"]["required"] == ["command", "path"]
    assert set(offered["memory"]["properties"]["command"]["enum"]) == {
        "view", "create", "str_replace", "insert", "delete", "rename"}
    assert set(offered["bash"]["properties"]) == {"command", "restart"}


async def test_tool_choice_must_name_a_tool_given(client, scripted):
    """Forcing a call with no tools, or to a tool not given, is a 400; forcing a server tool Velo leaves out is
    "auto", as that tool is gone."""
    for choice, tools in (({"type": "any"}, []), ({"type": "tool", "name": "write_file"}, [READ])):
        resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER,
                                                       "tools": tools, "tool_choice": choice})
        err = (await resp.json())["error"]
        assert resp.status == 400 and err["type"] == "invalid_request_error" and "tool_choice" in err["message"]
    assert scripted.requests == []
    resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER, "tools": [
        READ, {"type": "web_search_20250305", "name": "web_search"}], "tool_choice": {"type": "tool",
                                                                                        "name": "web_search"}})
    assert resp.status == 200 and scripted.requests[0].tool_choice is None


@pytest.mark.parametrize("body, field", [
    ({"model": "tiny", "messages": USER}, "max_tokens"),
    ({"model": "tiny", "max_tokens": 0, "messages": USER}, "max_tokens"),
    ({"model": "tiny", "max_tokens": 8, "messages": USER, "temperature": 1.5}, "temperature"),
    ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]}, "source"),
    ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"model": "tiny", "max_tokens": 8, "messages": []}, "at least one message"),
    # answered as without the empty last turn, so as `[]`: they went on as an empty chat (Ollama's: a model load)
    ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "assistant", "content": ""}]}, "at least one message"),
    ({"model": "tiny", "max_tokens": 8, "system": "Be brief.", "messages": [{"role": "system", "content": "x"}]},
     "at least one message"),
    ({"model": "tiny", "max_tokens": 8, "messages": USER, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"model": "tiny", "max_tokens": 8, "messages": USER, "tool_choice": {"type": [1]}}, "tool_choice"),  # was a 500
    ({"model": "tiny", "max_tokens": 8, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": 1024},
      "output_config": {"effort": "bogus"}}, "effort"),  # it went on to the backend as sent
    ({"model": "tiny", "max_tokens": 8, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": 1024},
      "output_config": {"effort": ["high"]}}, "effort"),  # was a 500
    # checked beside adaptive thinking (Claude Code's) and none too, as Anthropic checks it: both went by unread
    ({"model": "tiny", "max_tokens": 8, "messages": USER, "thinking": {"type": "adaptive"},
      "output_config": {"effort": "bogus"}}, "output_config.effort: must be one of"),
    ({"model": "tiny", "max_tokens": 8, "messages": USER, "output_config": {"effort": ["high"]}},
     "output_config.effort: must be one of"),
    ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
     "document"),
    # fields no backend reads, of the wrong type, went by unchecked: an error result said "yes" was read as a success
    ({"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "no such file",
                                      "is_error": "yes"}]}]}, "is_error must be a boolean"),
    ({"model": "tiny", "max_tokens": 2048, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": "1k"}},
     "budget_tokens must be an integer"),
    ({"model": "tiny", "max_tokens": 8, "messages": USER, "metadata": "user-1"}, "metadata must be an object"),
    ({"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "text is required"),
    # a call names its tool: two of one name were both offered, and its call checked against the last one's schema
    ({"model": "tiny", "max_tokens": 8, "messages": USER,
      "tools": [READ, {**READ, "input_schema": {"type": "object"}}]},
     "tools: tool names must be unique, 'read_file' is given twice"),
    ({"model": "tiny", "max_tokens": 8, "messages": USER,
      "tools": [READ, {"type": "bash_20250124", "name": "read_file"}]}, "tools: tool names must be unique"),
    ({"model": "tiny", "max_tokens": 8, "messages": USER, "tools": [{**READ, "name": ""}]}, "name must not be empty"),
    ({"model": "tiny", "max_tokens": 8, "messages": [  # Anthropic's own 400; a context edit cleared both results
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "b"}]}]},
     "messages.3.content.0: `tool_use` ids must be unique"),
])
async def test_bad_requests_are_400_in_anthropics_shape(client, body, field):
    resp = await client.post("/v1/messages", json=body)
    data = await resp.json()
    assert resp.status == 400 and data["type"] == "error"
    assert data["error"]["type"] == "invalid_request_error" and field in data["error"]["message"]


async def test_sdk_raises_its_own_errors(base_url):
    with pytest.raises(anthropic.BadRequestError) as e:
        await _client(base_url).messages.create(model="tiny", max_tokens=8, messages=USER,
                                                extra_body={"temperature": 3})
    assert e.value.body["error"]["type"] == "invalid_request_error"


class _Down(ScriptedBackend):
    def chat(self, req):
        raise BackendUnavailable("backend 's' is not reachable")


async def test_unavailable_backend_is_529_overloaded():
    async with TestClient(TestServer(make_app(Config(), {"s": _Down("s")}))) as c:
        resp = await c.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER})
        data = await resp.json()
    assert resp.status == 529 and data == {"type": "error", "request_id": resp.headers["request-id"], "error": {
        "type": "overloaded_error", "message": "backend 's' is not reachable"}}


class _Hung(ScriptedBackend):
    def chat(self, req):
        raise BackendTimeout("backend 's' sent no first data within 1s")


async def test_an_answer_cut_by_the_context_window_says_so(base_url, scripted: ScriptedBackend):
    """Cut before the client's max_tokens: the window ran out (`model_context_window_exceeded`, which Claude Code
    tells apart); cut at it: `max_tokens`. Before, both were max_tokens."""
    scripted.script.finish_reason = "length"  # after the script's 3 tokens
    sdk = _client(base_url)
    cut = await sdk.messages.create(model="tiny", max_tokens=1000, messages=USER)
    assert cut.stop_reason == "model_context_window_exceeded" and cut.usage.output_tokens == 3
    async with sdk.messages.stream(model="tiny", max_tokens=32000, messages=USER) as stream:
        assert (await stream.get_final_message()).stop_reason == "model_context_window_exceeded"
    assert (await sdk.messages.create(model="tiny", max_tokens=3, messages=USER)).stop_reason == "max_tokens"


class _StopsAtItsStop(ScriptedBackend):
    """Ends every answer at the first stop string it was sent, and says which, as the engine and llama-server do."""

    def chat(self, req):
        self.requests.append(req)
        return self._stopped(req.options.stop[0] if req.options.stop else None)

    async def _stopped(self, stop):
        yield Chunk(text="Hi", finish_reason="stop", stop_sequence=stop,
                    usage=Usage(prompt_tokens=5, completion_tokens=1))


@pytest.mark.parametrize("stream", [False, True])
async def test_only_the_clients_own_stop_sequence_is_named(stream):
    """A model's `stop` in config.toml (or a preset's) is no stop sequence of the client's: the answer it ends is
    `end_turn`, as Anthropic names only the request's `stop_sequences`; it said `stop_sequence: "<|end|>"` to a
    client that sent none."""
    config = Config(models={"tiny": ModelConfig(options={"stop": ["<|end|>"]})})
    async with TestClient(TestServer(make_app(config, {"s": _StopsAtItsStop("s")}))) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        for asked, reason, matched in (([], "end_turn", None), (["END"], "stop_sequence", "END")):
            args = dict(model="tiny", max_tokens=8, messages=USER, stop_sequences=asked)
            if stream:
                async with sdk.messages.stream(**args) as s:
                    msg = await s.get_final_message()
            else:
                msg = await sdk.messages.create(**args)
            assert (msg.stop_reason, msg.stop_sequence) == (reason, matched)


class _Uncounted(ScriptedBackend):
    """An OpenAI-compatible server that ignores `stream_options`: its answer comes with no counts."""

    def chat(self, req):
        self.requests.append(req)
        return self._uncounted()

    async def _uncounted(self):
        yield Chunk(text="Hi")
        yield Chunk(finish_reason="stop")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_backend_that_counts_nothing_leaves_the_estimate_not_zero(stream):
    """message_delta's input tokens were 0 where the backend counted none, and replaced message_start's estimate:
    the SDK's final message (and Claude Code's count of the context it fills) said 0."""
    async with TestClient(TestServer(make_app(Config(), {"s": _Uncounted("s")}))) as c:
        sdk = _client(str(c.make_url("")).rstrip("/"))
        args = dict(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Summarise this file. " * 20}])
        if stream:
            async with sdk.messages.stream(**args) as s:
                msg = await s.get_final_message()
        else:
            msg = await sdk.messages.create(**args)
    assert msg.usage.input_tokens == estimate(anthropic_dialect.parse_messages(args).request) > 100


async def test_errors_name_their_request_as_anthropics_do():
    """Anthropic's `request_id` in the body and its `request-id` header (the SDK's `e.request_id`); Velo's id in
    Anthropic's form, the same as X-Velo-Request-Id. A hung backend's 504 is `timeout_error` (was api_error)."""
    async with TestClient(TestServer(make_app(Config(), {"s": _Hung("s")}))) as c:
        resp = await c.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER})
        data = await resp.json()
        assert resp.status == 504 and data["error"]["type"] == "timeout_error"
        assert data["request_id"] == resp.headers["request-id"] == resp.headers["X-Velo-Request-Id"]
        assert re.fullmatch(r"req_[0-9a-f]{16}", data["request_id"])
        base = str(c.make_url("")).rstrip("/")
        with pytest.raises(anthropic.BadRequestError) as e:
            await _client(base).messages.create(model="tiny", max_tokens=8, messages=[])
        assert e.value.request_id == e.value.body["request_id"] and e.value.request_id.startswith("req_")
        refused = await c.post("/v1/messages", data=b"{", headers={"anthropic-version": "2023-06-01"})
        assert (await refused.json())["request_id"] == refused.headers["request-id"]


async def test_an_anthropic_client_off_velos_routes_gets_anthropics_errors():
    """A route of Anthropic's that Velo lacks (the files API), or a base URL given with its /v1 (Claude Code then
    asks /v1/v1/messages): the `anthropic-version` every Anthropic client sends marks the 404 and the 401 as
    Anthropic's, whose `type` the SDK reads (`e.type`); both were OpenAI's `invalid_request_error`. OpenAI's own
    routes keep OpenAI's errors whatever the headers."""
    config = Config()
    config.server.api_keys = ["good"]
    async with TestClient(TestServer(make_app(config, {"s": ScriptedBackend("s")}))) as c:
        base = str(c.make_url("")).rstrip("/")
        with pytest.raises(anthropic.NotFoundError) as missing:
            await anthropic.AsyncAnthropic(base_url=base, api_key="good", max_retries=0).beta.files.list()
        with pytest.raises(anthropic.NotFoundError) as doubled:
            await anthropic.AsyncAnthropic(base_url=base + "/v1", api_key="good", max_retries=0).messages.create(
                model="tiny", max_tokens=8, messages=USER)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await anthropic.AsyncAnthropic(base_url=base + "/v1", api_key="bad", max_retries=0).messages.create(
                model="tiny", max_tokens=8, messages=USER)
        openai = await c.post("/v1/chat/completions", json={}, headers={"anthropic-version": "2023-06-01",
                                                                         "Authorization": "Bearer good"})
        assert openai.status == 400 and (await openai.json())["error"]["param"] == "messages"
    assert [e.value.type for e in (missing, doubled, refused)] == [
        "not_found_error", "not_found_error", "authentication_error"]


async def test_an_answer_names_its_request_not_its_message(base_url):
    raw = await _client(base_url).messages.with_raw_response.create(model="tiny", max_tokens=8, messages=USER)
    assert raw.request_id == raw.headers["X-Velo-Request-Id"] and raw.request_id != (await raw.parse()).id


async def test_failure_mid_stream_is_an_error_event():
    backend = ScriptedBackend("s", script=Script(fail_after=1))
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as c:
        resp = await c.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER, "stream": True})
        events = sse_events(await resp.text())
    assert events[-1][0] == "error"
    assert events[-1][1] == {"type": "error", "error": {"type": "api_error",
                                                        "message": "scripted backend broke mid-stream"}}


async def test_x_api_key_authenticates_like_bearer():
    app = make_app(Config(server=ServerConfig(api_keys=["secret"])), {"s": ScriptedBackend("s")})
    async with TestClient(TestServer(app)) as c:
        base = str(c.make_url("")).rstrip("/")
        keyed = anthropic.AsyncAnthropic(base_url=base, api_key="secret", max_retries=0)
        assert (await keyed.messages.create(model="tiny", max_tokens=8, messages=USER)).content
        with pytest.raises(anthropic.AuthenticationError) as e:
            await _client(base).messages.create(model="tiny", max_tokens=8, messages=USER)
    assert e.value.body["error"]["type"] == "authentication_error"


class _NoTokenizer(ScriptedBackend):
    async def count_tokens(self, req):
        return None


async def test_count_tokens_uses_the_backends_count_else_an_estimate(base_url):
    counted = await _client(base_url).messages.count_tokens(model="tiny", messages=USER, system="Be brief.")
    assert counted.input_tokens == 5  # the scripted backend's own count: a word each, one per message
    async with TestClient(TestServer(make_app(Config(), {"s": _NoTokenizer("s")}))) as c:
        resp = await c.post("/v1/messages/count_tokens", json={"model": "tiny", "system": "y" * 40,
                                                               "messages": [{"role": "user", "content": "x" * 400}]})
        assert (await resp.json()) == {"input_tokens": 110}  # (400 + 40) characters / 4
    assert resp.headers["X-Velo-Token-Count"] == "estimate"


async def test_models_in_anthropics_shape_page_by_page():
    """`/v1/models` is shared with OpenAI: the `anthropic` SDK's `anthropic-version` gets Anthropic's ModelInfo and
    its cursor pages, which the SDK's iterator walks; the OpenAI SDK still gets its own list."""
    names = tuple(f"m{i}:latest" for i in range(25))
    backend = ScriptedBackend("s", models=names)
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as c:
        base = str(c.make_url("")).rstrip("/")
        sdk = _client(base)
        first = await sdk.models.list()
        assert [m.id for m in first.data] == list(names[:20]) and first.has_more and first.last_id == "m19:latest"
        assert [m.id async for m in await sdk.models.list(limit=7)] == list(names)
        back = await sdk.models.list(before_id="m10:latest", limit=4)
        assert [m.id for m in back.data] == list(names[6:10]) and back.has_more and back.first_id == "m6:latest"
        one = await sdk.models.retrieve("m3:latest")
        assert (one.type, one.display_name, one.max_input_tokens, one.lifecycle) == ("model", "m3:latest", 8192,
                                                                                    "active")
        assert one.capabilities.image_input.supported == ("vision" in backend.capabilities)
        assert one.capabilities.structured_outputs.supported
        assert one.created_at.year >= 1970
        with pytest.raises(anthropic.NotFoundError) as missing:
            await sdk.models.retrieve("nope")
        assert missing.value.body == {"type": "error", "error": {"type": "not_found_error",
                                                                 "message": "The model 'nope' does not exist"},
                                      "request_id": missing.value.request_id}
        for query, param in (({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"), ({"after_id": "zz"}, "after_id"),
                             ({"after_id": "m1:latest", "before_id": "m5:latest"}, "before_id")):
            resp = await c.get("/v1/models", params=query, headers={"anthropic-version": "2023-06-01"})
            body = await resp.json()
            assert resp.status == 400 and body["type"] == "error" and param in body["error"]["message"], body
        openai_shape = await (await c.get("/v1/models")).json()
    assert openai_shape["object"] == "list" and len(openai_shape["data"]) == 25


def test_model_capabilities_follow_the_models_own():
    seeing = anthropic_dialect.model_object(ModelInfo("m", capabilities=["completion", "vision", "thinking"]))
    assert seeing["capabilities"]["image_input"] == {"supported": True}
    assert seeing["capabilities"]["thinking"]["supported"] and seeing["capabilities"]["effort"]["high"]["supported"]
    plain = anthropic_dialect.model_object(ModelInfo("m"))["capabilities"]
    assert not plain["thinking"]["supported"] and plain["thinking"]["types"]["adaptive"] == {"supported": True}


def _agent_history(uses: int) -> list[dict]:
    """A user turn, then `uses` rounds of a Read call and its 40-word result."""
    out: list[dict] = [{"role": "user", "content": "fix the bug"}]
    for i in range(uses):
        out += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "read_file",
                                                   "input": {"path": f"f{i}.py"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                              "content": " ".join(["code"] * 40)}]}]
    return out


async def test_context_management_clears_old_tool_results_and_says_so(base_url, scripted: ScriptedBackend):
    """Anthropic's context editing through the SDK's beta client: past the trigger the oldest tool results reach
    the model cleared, and `context_management.applied_edits` (in message_delta, when streamed) says what went;
    count_tokens counts after the edits."""
    sdk = _client(base_url).beta.messages
    edits = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100},
                        "keep": {"type": "tool_uses", "value": 1}}]}
    ask = {"model": "tiny", "max_tokens": 8, "messages": _agent_history(4), "tools": [READ],
           "context_management": edits, "betas": ["context-management-2025-06-27"]}
    msg = await sdk.create(**ask)
    [applied] = msg.context_management.applied_edits
    assert (applied.type, applied.cleared_tool_uses) == ("clear_tool_uses_20250919", 3)
    results = [m.content for m in scripted.requests[-1].messages if m.role == "tool"]
    assert results[:3] == [context_edits.CLEARED] * 3 and results[3] == " ".join(["code"] * 40)
    assert applied.cleared_input_tokens == 3 * (40 - len(context_edits.CLEARED.split()))  # the double's count
    async with sdk.stream(**ask) as stream:
        final = await stream.get_final_message()
    assert final.context_management.applied_edits[0].cleared_tool_uses == 3
    counted = await sdk.count_tokens(**{k: v for k, v in ask.items() if k != "max_tokens"})
    assert counted.context_management.original_input_tokens - counted.input_tokens == applied.cleared_input_tokens
    plain = await sdk.create(**{**ask, "context_management": None})
    assert plain.context_management is None and len(scripted.requests[-1].messages) == 9


@pytest.mark.parametrize("edit, message", [
    ({"type": "compact_20260112"}, "context_management.edits.0.type"),
    ({"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}, "edits.0.keep"),
    ({"type": "clear_tool_uses_20250919", "clear_tool_inputs": "yes"}, "clear_tool_inputs"),
    ({"type": "clear_thinking_20251015", "keep": {"type": "turns", "value": 1}}, "edits.0.keep"),
])
async def test_bad_context_management_is_a_400_naming_the_edit(client, edit, message):
    resp = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": USER,
                                                   "context_management": {"edits": [edit]}})
    body = await resp.json()
    assert resp.status == 400 and message in body["error"]["message"], body


def test_context_management_defaults_and_claude_codes_keep_all():
    def edits(*given: dict) -> tuple:
        body = {"model": "tiny", "max_tokens": 8, "messages": USER, "context_management": {"edits": list(given)}}
        return anthropic_dialect.parse_messages(body).edits
    assert edits({"type": "clear_thinking_20251015", "keep": "all"}) == (context_edits.ClearThinking(None),)
    assert edits({"type": "clear_thinking_20251015"}) == (context_edits.ClearThinking(1),)
    assert edits({"type": "clear_tool_uses_20250919"}) == (context_edits.ClearToolUses(),)  # Anthropic's: 100k, 3
    assert edits({"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 5},
                  "clear_tool_inputs": ["Bash"], "exclude_tools": ["Read"]}) == (context_edits.ClearToolUses(
        trigger_tokens=None, trigger_uses=5, exclude=frozenset({"Read"}), clear_inputs=frozenset({"Bash"})),)
    assert anthropic_dialect.parse_messages({"model": "tiny", "max_tokens": 8, "messages": USER}).edits is None


async def test_an_empty_answer_streams_the_empty_text_block_the_whole_answer_has(base_url, scripted: ScriptedBackend):
    """A model that says nothing: the whole answer has one empty text block (code reading `content[0].text`), and
    the stream had none, so the SDK's streamed message had no content at all."""
    scripted.script.pieces = []
    whole = await _client(base_url).messages.create(model="tiny", max_tokens=64, messages=USER)
    async with _client(base_url).messages.stream(model="tiny", max_tokens=64, messages=USER) as stream:
        final = await stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content] == \
        [{"type": "text", "text": "", "citations": None}]


async def test_count_tokens_counts_the_prompt_as_it_is_sent(tmp_path):
    """A preset's system prompt goes in, and an image a model cannot see becomes its note: the count left both out
    (the engine's was 13 tokens short of the request's own; llama-server's was a 400 "does not support vision")."""
    from proxy.presets import PresetsConfig
    blind = ScriptedBackend("s", capabilities=("completion",))
    config = Config(presets=PresetsConfig(path=str(tmp_path / "presets.json")))
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}}
    note = "[1 image left out: this model cannot see images]"
    async with TestClient(TestServer(make_app(config, {"s": blind}))) as c:
        await c.post("/api/create", json={"model": "mario", "from": "tiny", "system": "You are Mario."})

        async def counted(body: dict) -> int:
            resp = await c.post("/v1/messages/count_tokens", json=body)
            assert resp.status == 200, await resp.text()
            return (await resp.json())["input_tokens"]
        seen = [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}]
        said = [{"role": "user", "content": f"What is it?\n{note}"}]
        assert await counted({"model": "tiny", "messages": seen}) == await counted({"model": "tiny", "messages": said})
        assert await counted({"model": "mario", "messages": USER}) == \
            await counted({"model": "tiny", "system": "You are Mario.", "messages": USER})
