"""Tools written into the conversation for models whose template ignores them, and what the HTTP adapters send."""
from __future__ import annotations

import orjson

from adapters.chat_template import message_dict
from adapters.ollama import chat_to_wire as ollama_wire
from adapters.openai_wire import chat_to_wire as openai_wire
from adapters.protocol import ChatRequest, Message, Tool, ToolCall
from adapters.tool_prompt import call_schema, in_prompt
from engine.chat_jinja import chat_template_env
from tests.llama_server import CHATML_TOOLS

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
    assert assistant.content == \
        'Reading.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
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


def test_the_prompt_form_is_qwens_own_rendering_byte_for_byte():
    """Written as Qwen2.5's template writes tools, calls (JSON as `tojson`) and a run of results (one user turn), a
    call the model made reads back as it made it, and a turn whose call is forced (tools in the prompt) reads the
    same prompt as one with native tools: compact JSON there made llama-server re-read a 622-token session from its
    5th token at the first unforced turn."""
    calls = [ToolCall("read_file", {"path": "b é.py", "lines": [1, 2]}, "c2"),
             ToolCall("read_file", {"path": "c"}, "c3")]
    history = [*HISTORY, Message("assistant", "", tool_calls=calls),
               Message("tool", "x = 1", tool_call_id="c2"), Message("tool", "y", tool_call_id="c3")]
    template = chat_template_env().from_string(CHATML_TOOLS)

    def rendered(req: ChatRequest) -> str:
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                    "parameters": t.parameters}} for t in req.tools] or None
        return template.render(messages=[message_dict(m) for m in req.messages], tools=tools,
                               add_generation_prompt=True)
    req = ChatRequest("m", history, tools=[READ])
    assert rendered(in_prompt(req)) == rendered(req)
