"""Tools written into the conversation for models whose template ignores them, and what the HTTP adapters send."""
from __future__ import annotations

import orjson

from adapters.ollama import chat_to_wire as ollama_wire
from adapters.openai_wire import chat_to_wire as openai_wire
from adapters.protocol import ChatRequest, Message, Tool, ToolCall
from adapters.tool_prompt import call_schema, in_prompt

READ = Tool("read_file", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})
HISTORY = [Message("system", "Be brief."), Message("user", "Read a.py"),
           Message("assistant", "Reading.", tool_calls=[ToolCall("read_file", {"path": "a.py"}, "c1")]),
           Message("tool", "print(1)", tool_call_id="c1", tool_name="read_file"), Message("user", "And?")]


def test_tools_calls_and_results_become_plain_turns():
    req = in_prompt(ChatRequest("m", HISTORY, tools=[READ], tool_choice="required", tools_in_prompt=True))
    system, user, assistant, result, last = req.messages
    assert system.role == "system" and system.content.startswith("Be brief.\n\n# Tools")
    assert orjson.loads(system.content.split("<tools>\n")[1].split("\n</tools>")[0]) == {
        "type": "function", "function": {"name": "read_file", "description": "Read a file",
                                         "parameters": READ.parameters}}
    assert "<tool_call>" in system.content and "</tool_call>" in system.content
    assert assistant.content == 'Reading.\n<tool_call>\n{"name":"read_file","arguments":{"path":"a.py"}}\n</tool_call>'
    assert assistant.tool_calls == [] and (result.role, result.content) == (
        "user", "<tool_response>\nprint(1)\n</tool_response>")
    assert (user.content, last.content) == ("Read a.py", "And?")
    assert (req.tools, req.tool_choice, req.tools_in_prompt) == ([], None, False)


def test_a_chat_without_a_system_prompt_gets_one():
    req = in_prompt(ChatRequest("m", [Message("user", "hi")], tools=[READ]))
    assert [m.role for m in req.messages] == ["system", "user"] and req.messages[0].content.startswith("# Tools")


def test_http_adapters_send_the_prompt_form_when_asked():
    req = ChatRequest("m", HISTORY, tools=[READ], tools_in_prompt=True)
    for body in (openai_wire(req), ollama_wire(req)):
        assert "tools" not in body and "# Tools" in body["messages"][0]["content"]
        assert all("tool_calls" not in m and m["role"] != "tool" for m in body["messages"])
    native = openai_wire(ChatRequest("m", HISTORY, tools=[READ]))
    assert native["tools"][0]["function"]["name"] == "read_file" and native["messages"][3]["role"] == "tool"


def test_call_schema_accepts_only_calls_of_the_tools():
    import jsonschema
    schema = call_schema([READ])
    jsonschema.validate({"name": "read_file", "arguments": {"path": "a"}}, schema)
    for bad in ({"name": "other", "arguments": {}}, {"name": "read_file"}, {"name": "read_file", "arguments": {},
                                                                              "x": 1}):
        assert not jsonschema.Draft202012Validator(schema).is_valid(bad)
