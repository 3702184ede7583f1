"""The OpenAI Responses API under /v1/responses, driven by the official `openai` package's `responses` (create,
stream, previous_response_id, retrieve, delete, input_items, input_tokens) plus raw-wire checks of what Codex
needs: numbered events, every item in `response.output_item.done`, `response.completed` last."""
from __future__ import annotations

import asyncio

import openai
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.errors import BadRequest
from adapters.protocol import ToolCall
from proxy.app import make_app
from proxy.config import Config
from proxy.dialects.responses import items_to_messages
from proxy.responses_store import ResponsesConfig
from tests.scripted import Script, ScriptedBackend


def _client(base_url: str, key: str = "sk-test") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)


def sse_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in filter(None, text.split("\n\n")):
        name, data = block.split("\n", 1)
        out.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return out


CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {
        "cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "namespace", "name": "files", "description": "File tools", "tools": [
        {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}}}}]},
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    {"type": "web_search"}]


async def test_create_returns_a_response_object(base_url, scripted: ScriptedBackend):
    r = await _client(base_url).responses.create(model="tiny", input="hi", instructions="Be brief.",
                                                 max_output_tokens=50, temperature=0.3)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == "Hello world" and r.output[0].type == "message" and r.output[0].role == "assistant"
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (5, 3, 8)
    assert (r.instructions, r.temperature, r.max_output_tokens, r.store) == ("Be brief.", 0.3, 50, True)
    req = scripted.requests[0]
    assert [(m.role, m.content) for m in req.messages] == [("system", "Be brief."), ("user", "hi")]
    assert (req.options.max_tokens, req.options.temperature) == (50, 0.3)


async def test_stream_events_are_numbered_and_complete(client, scripted: ScriptedBackend):
    scripted.script.thinking = "Think."
    scripted.script.tool_calls = [ToolCall("exec_command", {"cmd": "ls"}, "call_1")]
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "stream": True,
                                                    "tools": CODEX_TOOLS})
    events = sse_events(await resp.text())
    names = [e for e, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(d["type"] == e for e, d in events)
    assert names.count("response.output_item.added") == names.count("response.output_item.done") == 3
    done = [d["item"] for e, d in events if e == "response.output_item.done"]
    final = events[-1][1]["response"]
    assert final["output"] == done and final["status"] == "completed" and final["usage"]["total_tokens"] == 8
    assert [i["type"] for i in done] == ["reasoning", "message", "function_call"]
    assert done[0]["summary"] == [{"type": "summary_text", "text": "Think."}]
    assert orjson.loads(done[0]["encrypted_content"]) == {"type": "velo_reasoning", "version": 1, "text": "Think."}
    assert done[1]["content"][0]["text"] == "Hello world"
    assert (done[2]["call_id"], done[2]["name"], orjson.loads(done[2]["arguments"])) == ("call_1", "exec_command",
                                                                                        {"cmd": "ls"})
    assert "".join(d["delta"] for e, d in events if e == "response.output_text.delta") == "Hello world"


async def test_sdk_stream_helper_gives_the_final_response(base_url):
    async with _client(base_url).responses.stream(model="tiny", input="hi") as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hello world"


SEALED = orjson.dumps({"type": "velo_reasoning", "version": 1, "text": "I will run ls."}).decode()


async def test_a_codex_turn_converts_to_the_internal_conversation(client, scripted: ScriptedBackend):
    """store false, the system prompt as a developer item, reasoning echoed back, a call and its output,
    namespace and custom tools, a hosted tool that cannot run here."""
    body = {"model": "gpt-5-codex", "stream": True, "store": False, "tool_choice": "auto",
            "parallel_tool_calls": True, "reasoning": {"effort": "medium", "summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "tools": CODEX_TOOLS,
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": SEALED},
                {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "a.py\nb.py"},
                {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin"},
                {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done"}]}
    resp = await client.post("/v1/responses", json=body)
    assert resp.status == 200 and resp.headers["X-Velo-Tools-Ignored"] == "web_search"
    req = scripted.requests[0]
    for stream in (False, True):  # a line break in a name would end the header: aiohttp refused it, a 500
        resp = await client.post("/v1/responses", json={**body, "stream": stream, "tools": [
            {"type": "web_search", "name": "a\r\nX-B: 1"}]})
        assert resp.status == 200 and resp.headers["X-Velo-Tools-Ignored"] == "a  X-B: 1" and "X-B" not in resp.headers
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "You are Codex."), ("user", "list files"), ("assistant", ""), ("tool", "a.py\nb.py"),
        ("assistant", ""), ("tool", "Done")]
    assert req.messages[2].thinking == "I will run ls." and req.messages[2].tool_calls[0].arguments == {"cmd": "ls"}
    assert req.messages[4].tool_calls[0].arguments == {"input": "*** Begin"}
    assert [(m.tool_call_id, m.tool_name) for m in (req.messages[3], req.messages[5])] == [
        ("call_1", "exec_command"), ("call_2", "apply_patch")]
    assert [t.name for t in req.tools] == ["exec_command", "files.read", "apply_patch"]
    assert req.tools[2].parameters["properties"] == {"input": {"type": "string"}}
    assert "start: /.+/" in req.tools[2].description and req.think == "medium" and req.tool_choice is None


def test_reasoning_another_server_sealed_is_not_read_as_thinking():
    """OpenAI's own `encrypted_content` is opaque: an item of its with an empty summary gives no thinking (before,
    the blob became the model's thinking)."""
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}
    for content, thinking in (("gAAAAABopaqueBlob==", ""), ('{"type": "other"}', ""), (SEALED, "I will run ls.")):
        messages = items_to_messages([{"type": "reasoning", "summary": [], "encrypted_content": content}, answer])
        assert [(m.role, m.content, m.thinking) for m in messages] == [("assistant", "ok", thinking)]


def test_a_tool_output_keeps_its_images():
    """Codex's view_image answers with an `input_image` part; before, only the text parts reached the model."""
    messages = items_to_messages([
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "here:"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}])
    assert [(m.role, m.content, m.images) for m in messages[1:]] == [("tool", "here:", ["iVBORw0KGgo="])]
    with pytest.raises(BadRequest, match=r"input.0.output.0.image_url: only base64 data URLs"):
        items_to_messages([{"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}])


async def test_namespace_and_custom_calls_are_answered_in_their_own_shape(base_url, scripted: ScriptedBackend):
    scripted.script.tool_calls = [ToolCall("files.read", {"path": "a.py"}, "call_1"),
                                  ToolCall("apply_patch", {"input": "*** Begin"}, "call_2")]
    r = await _client(base_url).responses.create(model="tiny", input="go", tools=CODEX_TOOLS)
    read, patch = r.output[1], r.output[2]
    assert (read.type, read.name, read.namespace, orjson.loads(read.arguments)) == (
        "function_call", "read", "files", {"path": "a.py"})
    assert (patch.type, patch.name, patch.input, patch.call_id) == ("custom_tool_call", "apply_patch", "*** Begin",
                                                                   "call_2")


async def test_previous_response_id_continues_the_conversation(base_url, scripted: ScriptedBackend):
    client = _client(base_url)
    first = await client.responses.create(model="tiny", input="My name is Ada.", instructions="Be brief.")
    await client.responses.create(model="tiny", input="What is my name?", previous_response_id=first.id)
    second = scripted.requests[1]
    assert [(m.role, m.content) for m in second.messages] == [
        ("user", "My name is Ada."), ("assistant", "Hello world"), ("user", "What is my name?")]
    assert (await client.responses.retrieve(first.id)).output_text == "Hello world"
    items = await client.responses.input_items.list(first.id)
    assert [i.content[0].text for i in items.data] == ["My name is Ada."]


async def test_item_references_name_stored_items_of_the_same_key(base_url, scripted: ScriptedBackend):
    """The AI SDK's `openai(model)` (the Responses API, `store` on) sends earlier turns back as `item_reference`s to
    their ids; its second request was a 400. A reference stands for the item as stored, for its own key only."""
    mine, other = _client(base_url, "key-a"), _client(base_url, "key-b")
    first = await mine.responses.create(model="tiny", input="My name is Ada.")
    [said] = first.output
    turn = [{"role": "user", "content": "My name is Ada."}, {"type": "item_reference", "id": said.id},
            {"role": "user", "content": "What is my name?"}]
    await mine.responses.create(model="tiny", input=turn)
    assert [(m.role, m.content) for m in scripted.requests[-1].messages] == [
        ("user", "My name is Ada."), ("assistant", "Hello world"), ("user", "What is my name?")]
    for client, missing in ((other, said.id), (mine, "msg_nowhere")):
        with pytest.raises(openai.NotFoundError) as e:
            await client.responses.create(model="tiny", input=[{"type": "item_reference", "id": missing}])
        assert e.value.body["param"] == "input" and f"Item with id '{missing}' not found" in e.value.body["message"]
    async with mine.responses.stream(model="tiny", input="Hi") as stream:
        streamed = await stream.get_final_response()
    await mine.responses.create(model="tiny", input=[{"type": "item_reference", "id": streamed.output[0].id}])
    assert scripted.requests[-1].messages[-1].content == "Hello world"
    await mine.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await mine.responses.create(model="tiny", input=turn)


async def test_deleting_a_turn_keeps_the_items_an_earlier_response_holds(base_url, scripted: ScriptedBackend):
    """A turn naming an earlier response's item (`item_reference`) took the item over: deleting that turn left the
    item a 404, though the response that made it was still stored. Deleting that one still ends it."""
    sdk = _client(base_url)
    first = await sdk.responses.create(model="tiny", input="My name is Ada.")
    turn = [{"type": "item_reference", "id": first.output[0].id}, {"role": "user", "content": "What is my name?"}]
    second = await sdk.responses.create(model="tiny", input=turn)
    await sdk.responses.delete(second.id)
    await sdk.responses.create(model="tiny", input=turn)
    assert scripted.requests[-1].messages[0].content == "Hello world"
    await sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.create(model="tiny", input=turn)


async def test_an_empty_answer_keeps_its_text_part(base_url, scripted: ScriptedBackend):
    """n8n's agent read `content: []` after a tool result; OpenAI and Ollama give the message an empty text part."""
    scripted.script.pieces = []
    r = await _client(base_url).responses.create(model="tiny", input="hi")
    assert [(p.type, p.text) for p in r.output[0].content] == [("output_text", "")] and r.output_text == ""


async def test_the_response_echoes_what_codex_and_the_sdk_send(base_url):
    """Fields the SDK's Response models and Codex sends (prompt_cache_key, text.verbosity) come back as sent; before,
    they were null and `text` lost its verbosity."""
    r = await _client(base_url).responses.create(
        model="tiny", input="hi", prompt_cache_key="k1", safety_identifier="u1", max_tool_calls=3,
        prompt_cache_retention="24h", service_tier="flex", text={"verbosity": "low"}, metadata={"run": "7"})
    assert (r.prompt_cache_key, r.safety_identifier, r.max_tool_calls, r.prompt_cache_retention) == (
        "k1", "u1", 3, "24h")
    assert r.text.verbosity == "low" and r.text.format.type == "text" and r.service_tier == "default"
    assert r.metadata == {"run": "7"}
    plain = await _client(base_url).responses.create(model="tiny", input="hi")
    assert (plain.prompt_cache_key, plain.max_tool_calls, plain.text.verbosity) == (None, None, "medium")
    assert (plain.temperature, plain.top_p) == (1.0, 1.0)  # the API's defaults (adapters/options.py)
    greedy = await _client(base_url).responses.create(model="tiny", input="hi", temperature=0, top_p=0.5)
    assert (greedy.temperature, greedy.top_p) == (0, 0.5)


async def test_input_items_page_as_openai_lists_them(base_url):
    """Newest first by default, `limit` and `after`, ids kept between calls, a message's text as a content part;
    before: oldest first, every item at once, ids `item_0`..., string content as it was sent."""
    sdk = _client(base_url)
    r = await sdk.responses.create(model="tiny", input=[
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "There?"}]}])
    newest = await sdk.responses.input_items.list(r.id, limit=2)
    assert [i.content[0].text for i in newest.data] == ["There?", "Hi"] and newest.has_more
    assert all(i.id.startswith("msg_") and i.status == "completed" for i in newest.data)
    rest = await sdk.responses.input_items.list(r.id, limit=2, after=newest.last_id)
    assert [i.content[0].text for i in rest.data] == ["Be brief."] and not rest.has_more
    every = [i async for i in sdk.responses.input_items.list(r.id, order="asc", limit=1)]  # the SDK walks the pages
    assert [i.id for i in every] == [i.id for i in [*newest.data, *rest.data][::-1]]
    # `before` (Azure's reference, older SDKs' parameter): the page just before that item; it was ignored, and the
    # first page came back
    back = await sdk.responses.input_items.list(r.id, limit=1, extra_query={"before": rest.first_id})
    assert [i.content[0].text for i in back.data] == ["Hi"] and back.has_more
    back = await sdk.responses.input_items.list(r.id, limit=5, extra_query={"before": rest.first_id})
    assert [i.content[0].text for i in back.data] == ["There?", "Hi"] and not back.has_more
    for query, param in (({"order": "up"}, "order"), ({"limit": "0"}, "limit"), ({"after": "msg_x"}, "after"),
                         ({"extra_query": {"before": "msg_x"}}, "before"),
                         ({"after": every[0].id, "extra_query": {"before": every[1].id}}, "before")):
        with pytest.raises(openai.BadRequestError) as e:
            await sdk.responses.input_items.list(r.id, **query)
        assert e.value.param == param


async def test_input_items_have_the_fields_openai_lists_them_with(base_url):
    """Every listed item has its `status`, which the SDK's `*Item` types require of a call and of a call's output as
    of a message, and an assistant's text its `annotations`: calls and outputs were listed without a status, and an
    assistant's text sent as a string without annotations (the SDK read None; typed clients fail on them), nor as a
    part without them, nor an image part without its `detail` (in a message, or a call's output: Codex's view_image
    answers with one)."""
    sdk = _client(base_url)
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    r = await sdk.responses.create(model="tiny", input=[
        {"role": "user", "content": "Fix it"}, {"role": "assistant", "content": "Which file?"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "This one?"}]},
        {"role": "user", "content": [image, {"type": "input_image", "detail": "low", "image_url": image["image_url"]}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "g", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "y"},
        {"type": "function_call", "call_id": "c3", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c3", "output": [image, {"type": "input_text", "text": "a"}]},
        {"type": "custom_tool_call", "call_id": "c4", "name": "g", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "c4", "output": [image]}])
    items = (await sdk.responses.input_items.list(r.id, order="asc")).data
    assert [(i.type, i.status) for i in items] == [
        ("message", "completed"), ("message", "completed"), ("message", "completed"), ("message", "completed"),
        ("function_call", "completed"),
        ("function_call_output", "completed"), ("custom_tool_call", "completed"),
        ("custom_tool_call_output", "completed")] + [
        ("function_call", "completed"), ("function_call_output", "completed"), ("custom_tool_call", "completed"),
        ("custom_tool_call_output", "completed")]
    assert [(p.type, p.text, p.annotations) for p in items[1].content] == [("output_text", "Which file?", [])]
    assert [(p.type, p.text, p.annotations) for p in items[2].content] == [("output_text", "This one?", [])]
    assert [p.detail for p in items[3].content] == ["auto", "low"]
    assert (items[9].output[0].detail, items[9].output[1].text, items[11].output[0].detail) == ("auto", "a", "auto")


async def test_stored_responses_belong_to_their_api_key(base_url):
    mine, other = _client(base_url, "key-a"), _client(base_url, "key-b")
    r = await mine.responses.create(model="tiny", input="secret")
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as e:  # OpenAI's 400 for a chain it cannot continue
        await other.responses.create(model="tiny", input="x", previous_response_id=r.id)
    assert (e.value.code, e.value.param) == ("previous_response_not_found", "previous_response_id")
    assert e.value.body["message"] == f"Previous response with id '{r.id}' not found."
    with pytest.raises(openai.NotFoundError):
        await other.responses.delete(r.id)
    await mine.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        await mine.responses.retrieve(r.id)
    assert e.value.body["code"] is None and "not found" in e.value.body["message"]
    assert e.value.body["type"] == "invalid_request_error"  # OpenAI's type for a 404, not Anthropic's


async def test_an_items_id_is_no_responses_id(base_url):
    """Items were kept under "item:<id>" beside the responses: GET and DELETE /v1/responses/item:<id> read an item's
    entry as a response, a 500."""
    sdk = _client(base_url)
    r = await sdk.responses.create(model="tiny", input="hi")
    for item_id in (r.output[0].id, (await sdk.responses.input_items.list(r.id)).data[0].id):
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(f"item:{item_id}")
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.delete(f"item:{item_id}")
    assert (await sdk.responses.retrieve(r.id)).output_text == "Hello world"


async def test_store_false_keeps_nothing(base_url):
    r = await _client(base_url).responses.create(model="tiny", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await _client(base_url).responses.retrieve(r.id)


async def test_stored_responses_expire_and_survive_a_restart_in_sqlite(tmp_path):
    cfg = Config(responses=ResponsesConfig(ttl_s=0.3, sqlite_path=str(tmp_path / "responses.db")))
    async with TestClient(TestServer(make_app(cfg, {"s": ScriptedBackend("s")}))) as c:
        r = await (await c.post("/v1/responses", json={"model": "tiny", "input": "hi"})).json()
    async with TestClient(TestServer(make_app(cfg, {"s": ScriptedBackend("s")}))) as c:  # a restart
        assert (await c.get(f"/v1/responses/{r['id']}")).status == 200
        referred = [{"type": "item_reference", "id": r["output"][0]["id"]}]
        assert (await c.post("/v1/responses", json={"model": "tiny", "input": referred})).status == 200
        await asyncio.sleep(0.4)
        assert (await c.get(f"/v1/responses/{r['id']}")).status == 404


async def test_output_limit_makes_an_incomplete_response(base_url, scripted: ScriptedBackend):
    scripted.script.finish_reason = "length"
    r = await _client(base_url).responses.create(model="tiny", input="hi", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"  # the message the limit cut, as OpenAI marks it
    async with _client(base_url).responses.stream(model="tiny", input="hi", max_output_tokens=3) as stream:
        done = [e.item.status async for e in stream if e.type == "response.output_item.done"]
        final = await stream.get_final_response()
    assert done == ["incomplete"] and final.status == "incomplete" and final.output[0].status == "incomplete"


async def test_logprobs_come_with_the_text_when_included(base_url, scripted: ScriptedBackend):
    """`include: ["message.output_text.logprobs"]` (with `top_logprobs` alternatives) gives each text delta its
    tokens and the finished text all of them; without it the model is not asked for any."""
    sdk, include = _client(base_url), ["message.output_text.logprobs"]
    whole = await sdk.responses.create(model="tiny", input="hi", include=include, top_logprobs=2)
    part = whole.output[0].content[0]
    assert [lp.token for lp in part.logprobs] == ["Hel", "lo", " world"] and whole.top_logprobs == 2
    assert part.logprobs[0].top_logprobs[1].token == " x" and part.logprobs[0].bytes == list(b"Hel")
    assert scripted.requests[-1].options.top_logprobs == 2
    async with sdk.responses.stream(model="tiny", input="hi", include=include) as stream:
        deltas = [[lp.token for lp in e.logprobs] async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert deltas == [["Hel"], ["lo"], [" world"]] and len(final.output[0].content[0].logprobs) == 3
    plain = await sdk.responses.create(model="tiny", input="hi", top_logprobs=3)
    assert plain.output[0].content[0].logprobs == [] and not scripted.requests[-1].options.logprobs
    assert plain.top_logprobs == 3  # echoed as sent, as OpenAI does
    with pytest.raises(openai.BadRequestError) as e:
        await sdk.responses.create(model="tiny", input="hi", include=include, top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs"


async def test_unheld_state_is_a_400(base_url, scripted):
    """A stored conversation or prompt, which Velo does not keep, is a 400 naming it rather than an answer to a
    question without its context."""
    sdk = _client(base_url)
    for unheld in ({"conversation": "conv_1"}, {"prompt": {"id": "pmpt_1"}}):
        with pytest.raises(openai.BadRequestError) as e:
            await sdk.responses.create(model="tiny", input="hi", **unheld)
        assert e.value.body["param"] == next(iter(unheld))
    assert scripted.requests == []


async def test_a_turn_without_input_is_openais_400_unless_a_stored_response_carries_it(base_url, scripted):
    """`input` is optional in the SDK because `previous_response_id` can carry the conversation; with nothing to carry
    it, OpenAI answers 400 `Missing required parameter: 'input'.` where Velo ran the model on an empty conversation.
    Counting tokens needs no input (instructions alone count)."""
    sdk = _client(base_url)
    for create in (sdk.responses.create, sdk.responses.compact):
        with pytest.raises(openai.BadRequestError) as e:
            await create(model="tiny", instructions="Be brief.")
        assert e.value.status_code == 400 and e.value.body == {
            "message": "Missing required parameter: 'input'.", "type": "invalid_request_error", "param": "input",
            "code": "missing_required_parameter"}
    with pytest.raises(openai.BadRequestError) as e:
        await sdk.responses.create(model="tiny", instructions="Be brief.", input=[])
    assert e.value.body["param"] == "input" and "empty array" in e.value.body["message"]
    assert scripted.requests == []
    first = await sdk.responses.create(model="tiny", input="My name is Ada.")
    again = await sdk.responses.create(model="tiny", previous_response_id=first.id, input=[])
    assert again.output_text == "Hello world"
    assert [m.content for m in scripted.requests[-1].messages] == ["My name is Ada.", "Hello world"]
    assert (await sdk.responses.input_tokens.count(model="tiny", instructions="be brief")).input_tokens > 0


async def test_text_format_and_reasoning_effort_reach_the_request(client, scripted: ScriptedBackend):
    scripted.script.pieces = ['{"a": 1}']
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    resp = await client.post("/v1/responses", json={
        "model": "tiny", "input": "hi", "reasoning": {"effort": "minimal"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}}})
    assert resp.status == 200 and scripted.requests[0].format == schema and scripted.requests[0].think is False


async def test_failure_mid_stream_fails_the_response():
    backend = ScriptedBackend("s", script=Script(fail_after=1))
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as c:
        resp = await c.post("/v1/responses", json={"model": "tiny", "input": "hi", "stream": True})
        events = sse_events(await resp.text())
    assert events[-1][0] == "response.failed"
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"] == "scripted backend broke mid-stream"
    assert failed["error"]["code"] == "server_error"  # one of the codes the SDKs' ResponseError allows
    message = next(e[1]["item"] for e in events if e[0] == "response.output_item.done")
    assert message["status"] == "incomplete" and failed["output"] == [message]  # never finished, never "completed"
    error = next(e[1] for e in events if e[0] == "error")
    assert error["code"] == "backend_error"  # the error event's code is any string: Velo's own kind
    backend.script = Script(thinking="Let me see", fail_after=0)  # cut while it reasons
    async with TestClient(TestServer(make_app(Config(), {"s": backend}))) as c:
        resp = await c.post("/v1/responses", json={"model": "tiny", "input": "hi", "stream": True})
        events = sse_events(await resp.text())
    reasoning = next(e[1]["item"] for e in events if e[0] == "response.output_item.done")
    assert (reasoning["type"], reasoning["status"]) == ("reasoning", "incomplete")


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(fail_after=1))])
async def test_a_stream_that_fails_is_stored_failed(base_url, client: TestClient) -> None:
    """`store: true`: OpenAI keeps a response that failed, with its status and error, under the id its stream gave; a
    retrieve of it was a 404. Stored before `response.failed` is sent, as a completed one is before its end."""
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "stream": True},
                             headers={"Authorization": "Bearer sk-test"})
    async for line in resp.content:
        if line.startswith(b'data: {"type":"response.failed"'):
            failed = orjson.loads(line.removeprefix(b"data: "))["response"]
            break
    raw = await client.get(f"/v1/responses/{failed['id']}", headers={"Authorization": "Bearer sk-test"})
    assert raw.status == 200 and await raw.json() == failed and not resp.content.at_eof()
    await resp.read()
    kept = await _client(base_url).responses.retrieve(failed["id"])
    assert (kept.status, kept.error.code, kept.error.message) == ("failed", "server_error",
                                                                   "scripted backend broke mid-stream")
    assert kept.output[0].status == "incomplete"
    items = await _client(base_url).responses.input_items.list(failed["id"])
    assert [i.content[0].text for i in items.data] == ["hi"]


@pytest.mark.parametrize("body, param", [
    ({"model": "tiny", "input": 5}, "input"),
    ({"model": "tiny", "input": "hi", "temperature": 3}, "temperature"),
    ({"model": "tiny", "input": "hi", "text": {"format": {"type": "yaml"}}}, "text"),
    ({"model": "tiny", "input": "hi", "tool_choice": {"type": "mystery"}}, "tool_choice"),
    ({"model": "tiny", "input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"model": "tiny", "input": "hi", "tool_choice": {"type": "function", "name": "g"}, "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}}]}, "tool_choice"),
    ({"model": "tiny", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]},
     "input"),
    # these were 500s (a TypeError joining the parts)
    ({"model": "tiny", "input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_text", "text": 5}]}]}, "text"),
    ({"model": "tiny", "input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": 5}]},
                                 {"role": "user", "content": "hi"}]}, "text"),
    ({"model": "tiny", "input": [{"type": "reasoning", "content": 7}, {"role": "user", "content": "hi"}]}, "input"),
    # echoed as sent, a 200: OpenAI's bounds, typed clients read an object of strings
    ({"model": "tiny", "input": "hi", "metadata": [1]}, "metadata"),
    ({"model": "tiny", "input": "hi", "metadata": {"n": 1}}, "metadata"),
    ({"model": "tiny", "input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"model": "tiny", "input": "hi", "metadata": {"k" * 65: "v"}}, "metadata"),
    ({"model": "tiny", "input": "hi", "metadata": {"k": "v" * 513}}, "metadata"),
    ({"model": "tiny", "input": "hi", "reasoning": {"effort": ["high"]}}, "reasoning"),  # was a 500
    ({"model": "tiny", "input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning"),  # reached the backend
    ({"model": "tiny", "input": "hi", "tools": [{"type": "custom", "name": "c", "format": "lark"}]}, "format"),  # 500s
    ({"model": "tiny", "input": "hi", "tools": [{"type": "custom", "name": "c", "description": 5}]}, "description"),
    ({"model": "tiny", "input": "hi", "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [
        {"type": "function", "name": ["f"]}]}}, "name"),  # was a 500
    # a tool without a type was taken for a hosted one and left out: the model answered without it, a 200
    ({"model": "tiny", "input": "hi", "tools": [{"name": "f", "parameters": {"type": "object"}}]}, "tools"),
    ({"model": "tiny", "input": "hi", "tools": [{"type": 5, "name": "f"}]}, "tools"),
    ({"model": "tiny", "input": "hi", "tools": [{"type": "namespace", "name": "ns", "tools": [{"name": "f"}]}]},
     "tools"),
    # echoed as sent, a 200, where typed clients read these as strings (an enum) and numbers
    ({"model": "tiny", "input": "hi", "text": {"verbosity": "extreme"}}, "verbosity"),
    ({"model": "tiny", "input": "hi", "reasoning": {"summary": 5}}, "summary"),
    ({"model": "tiny", "input": "hi", "user": 5}, "user"),
    ({"model": "tiny", "input": "hi", "prompt_cache_key": ["k"]}, "prompt_cache_key"),
    ({"model": "tiny", "input": "hi", "max_tool_calls": "3"}, "max_tool_calls"),
    # tools of one name (or none) were all offered, and a call was checked against one's schema: a function's call
    # named as a custom tool was answered as a custom_tool_call
    ({"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f",
                                                 "parameters": {"type": "object"}}]}, "tools"),
    ({"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": "f"}, {"type": "custom", "name": "f"}]},
     "tools"),
    ({"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": "files.read"}, {
        "type": "namespace", "name": "files", "tools": [{"type": "function", "name": "read"}]}]}, "tools"),
    ({"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": ""}]}, "tools"),
    # an item's id that is no string was kept, stored and listed as sent (typed clients read a string)
    ({"model": "tiny", "input": [{"role": "user", "content": "hi", "id": 5}]}, "input"),
    ({"model": "tiny", "input": [{"role": "user", "content": "hi", "id": {"a": 1}}]}, "input"),
    # an allowed_tools mode that is neither auto nor required was auto, and one left out was a 200 too
    ({"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": {
        "type": "allowed_tools", "mode": "requried", "tools": [{"type": "function", "name": "f"}]}}, "tool_choice"),
    ({"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": {
        "type": "allowed_tools", "tools": [{"type": "function", "name": "f"}]}}, "tool_choice"),
])
async def test_bad_requests_are_400_in_openais_shape(client, body, param):
    resp = await client.post("/v1/responses", json=body)
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["type"] == "invalid_request_error" and err["param"] == param
    assert err["code"] is None or isinstance(err["code"], str)


@pytest.mark.parametrize("tool, choice", [
    ({"type": "web_search_preview"}, {"type": "web_search_preview"}),
    ({"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "file_search"}),
    ({"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example"},
     {"type": "mcp", "server_label": "docs"}),
])
async def test_a_choice_of_a_hosted_tool_given_is_left_to_the_model(client, scripted, tool, choice):
    """A built-in tool's choice (the openai-agents SDK sends `tool_choice="web_search_preview"` so) for a hosted tool
    that was given: that tool is left out here, so the model answers without it, as Velo answers a forced hosted
    tool elsewhere (proxy/dialects/tool_choice.py); it was a 400. A hosted tool not given stays a 400."""
    fn = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "tools": [fn, tool],
                                                    "tool_choice": choice})
    assert resp.status == 200, await resp.text()
    assert scripted.requests[0].tool_choice is None and [t.name for t in scripted.requests[0].tools] == ["f"]
    assert (await resp.json())["tool_choice"] == choice
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "tools": [fn],
                                                    "tool_choice": choice})
    assert resp.status == 400 and (await resp.json())["error"]["param"] == "tool_choice"


@pytest.mark.parametrize("effort, think", [("minimal", False), ("medium", "medium"), ("xhigh", "high"),
                                           ("max", "high")])
async def test_reasoning_effort_is_the_think_switch(client, scripted, effort, think):
    """The same levels as OpenAI chat's `reasoning_effort` (proxy/dialects/openai.py EFFORTS)."""
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "reasoning": {"effort": effort}})
    assert resp.status == 200 and scripted.requests[0].think == think


async def test_input_tokens_counts_the_turn(base_url):
    counted = await _client(base_url).responses.input_tokens.count(model="tiny", input="two words",
                                                                    instructions="be brief")
    assert counted.input_tokens == 6 and counted.object == "response.input_tokens"  # a word each, one per turn


async def test_an_empty_answer_streams_the_empty_message_the_whole_answer_has(base_url, scripted: ScriptedBackend):
    scripted.script.pieces = []
    whole = await _client(base_url).responses.create(model="tiny", input="hi")
    async with _client(base_url).responses.stream(model="tiny", input="hi") as stream:
        final = await stream.get_final_response()
    assert final.output_text == whole.output_text == ""
    assert [(i.type, [c.text for c in i.content]) for i in final.output] == \
        [(i.type, [c.text for c in i.content]) for i in whole.output] == [("message", [""])]


@pytest.mark.parametrize("scripted", [ScriptedBackend(script=Script(after_finish=1.0))])
async def test_a_streamed_response_is_stored_before_it_is_announced_completed(client: TestClient) -> None:
    """The pipeline's work after the answer (the cache's store) came before the response was stored, and after
    `response.completed`: a client continuing at once with `previous_response_id` found no response. Stored once."""
    from proxy.state import RESPONSES
    store, puts = client.server.app[RESPONSES], []
    put = store.put

    async def counted(*args):
        puts.append(args)
        await put(*args)
    store.put = counted
    resp = await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "stream": True})
    async for line in resp.content:
        if line.startswith(b'data: {"type":"response.completed"'):
            resp_id = orjson.loads(line.removeprefix(b"data: "))["response"]["id"]
            break
    stored = await client.get(f"/v1/responses/{resp_id}")
    assert stored.status == 200 and (await stored.json())["output"][0]["content"][0]["text"] == "Hello world"
    assert not resp.content.at_eof()  # the answer's stream was still open
    await resp.read()
    assert len(puts) == 1


async def test_input_tokens_counts_the_prompt_as_it_is_sent():
    """An image a model cannot see is counted as the note it becomes (count_request.py)."""
    blind = ScriptedBackend("s", capabilities=("completion",))
    note = "[1 image left out: this model cannot see images]"
    async with TestClient(TestServer(make_app(Config(), {"s": blind}))) as c:
        async def counted(content: list) -> int:
            resp = await c.post("/v1/responses/input_tokens", json={"model": "tiny", "input": [
                {"role": "user", "content": content}]})
            assert resp.status == 200, await resp.text()
            return (await resp.json())["input_tokens"]
        image = {"type": "input_image", "image_url": "data:image/png;base64,QUJD"}
        assert await counted([{"type": "input_text", "text": "What is it?"}, image]) == \
            await counted([{"type": "input_text", "text": f"What is it?\n{note}"}])
