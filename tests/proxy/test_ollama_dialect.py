"""The Ollama native API as Continue and Open WebUI use it, driven by the real `ollama` client package."""
from __future__ import annotations

import asyncio
import ollama
import orjson
import pytest

from adapters.protocol import Chunk, ModelInfo, TokenLogprob, ToolCall
from proxy.dialects.ollama import generate_object
from proxy.dialects.ollama_models import show_object
from tests.scripted import ScriptedBackend


async def test_chat_streams_ndjson_with_final_timings(client, scripted: ScriptedBackend):
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                               "options": {"num_predict": 7, "temperature": 0, "stop": ["\n"],
                                                           "num_ctx": 2048, "mirostat": 1}})
    assert resp.status == 200 and resp.content_type == "application/x-ndjson"
    lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    assert "".join(line["message"]["content"] for line in lines) == "Hello world"
    assert [line["done"] for line in lines] == [False, False, False, True]
    final = lines[-1]
    assert final["done_reason"] == "stop" and final["eval_count"] == 3 and final["prompt_eval_count"] == 5
    assert final["total_duration"] > 0
    opts = scripted.requests[0].options
    assert (opts.max_tokens, opts.temperature, opts.stop, opts.num_ctx) == (7, 0.0, ["\n"], 2048)
    assert opts.extra == {"mirostat": 1}


async def test_timings_the_backend_did_not_report_are_left_out(client, scripted: ScriptedBackend):
    """Ollama's Metrics are `omitempty` (api/types.go), streamed or whole: the done line said load_duration and
    prompt_eval_duration 0 where the backend reported none, as if that work had taken no time."""
    scripted.script.eval_ns = 2_000_000  # no load or prompt reading reported
    chat, generate = {"messages": [{"role": "user", "content": "hi"}]}, {"prompt": "hi"}
    for path, body in (("/api/chat", chat), ("/api/generate", generate)):
        for stream in (True, False):
            resp = await client.post(path, json={"model": "tiny", "stream": stream, **body})
            done = orjson.loads((await resp.read()).splitlines()[-1])
            timings = {k: v for k, v in done.items() if k.endswith(("_duration", "_count"))}
            assert timings.pop("total_duration") > 0  # Velo's clock, from the request's arrival
            assert timings == {"eval_duration": 2_000_000, "eval_count": 3, "prompt_eval_count": 5}


async def test_an_embeddings_figures_the_backend_did_not_report_are_left_out(client):
    """Ollama's EmbedResponse figures are `omitempty` too (api/types.go); its total it times itself."""
    body = await (await client.post("/api/embed", json={"model": "tiny", "input": ["a", "b"]})).json()
    assert body["prompt_eval_count"] == 2 and body["total_duration"] > 0 and "load_duration" not in body


async def test_real_ollama_client_chat_stream_and_tools(base_url, scripted: ScriptedBackend):
    scripted.script.tool_calls = [ToolCall(name="get_weather", arguments={"city": "Paris"}, id="call_p4r1s000")]
    c = ollama.AsyncClient(host=base_url)  # the package has no field for a call's id: it must still parse the line
    parts = [p async for p in await c.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
                                             tools=[{"type": "function", "function": {"name": "get_weather",
                                                     "parameters": {"type": "object"}}}])]
    assert "".join(p.message.content or "" for p in parts) == "Hello world"
    calls = [tc for p in parts for tc in (p.message.tool_calls or [])]
    assert calls[0].function.name == "get_weather" and calls[0].function.arguments == {"city": "Paris"}
    assert scripted.requests[0].tools[0].name == "get_weather"


async def test_parallel_calls_stream_one_a_line_as_ollama_sends_them(client, scripted: ScriptedBackend):
    """Ollama's parser sends each call as it completes, `index` counting on; Zed reads only a line's first call."""
    scripted.script.tool_calls = [ToolCall("read_file", {"path": "a.py"}, id="call_a"),
                                  ToolCall("read_file", {"path": "b.py"}, id="call_b")]
    resp = await client.post("/api/chat", json={"model": "tiny", "tools": [{"type": "function", "function": {
        "name": "read_file", "parameters": {"type": "object"}}}], "messages": [{"role": "user", "content": "hi"}]})
    lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    with_calls = [line["message"]["tool_calls"] for line in lines if line["message"].get("tool_calls")]
    assert with_calls == [[{"id": "call_a", "function": {"index": 0, "name": "read_file",
                                                         "arguments": {"path": "a.py"}}}],
                          [{"id": "call_b", "function": {"index": 1, "name": "read_file",
                                                         "arguments": {"path": "b.py"}}}]]
    assert "".join(line["message"]["content"] for line in lines) == "Hello world"
    assert [line["done"] for line in lines].count(True) == 1 and lines[-1]["done_reason"] == "stop"
    whole = await (await client.post("/api/chat", json={"model": "tiny", "stream": False, "messages": [
        {"role": "user", "content": "hi"}]})).json()
    assert len(whole["message"]["tool_calls"]) == 2  # one answer keeps its calls together, as Ollama's does


async def test_the_ollama_client_reads_parallel_calls_streamed_one_a_line(base_url, scripted: ScriptedBackend):
    scripted.script.tool_calls = [ToolCall("read_file", {"path": "a.py"}, id="call_a"),
                                  ToolCall("read_file", {"path": "b.py"}, id="call_b")]
    c = ollama.AsyncClient(host=base_url)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    parts = [p async for p in await c.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
                                             tools=tools)]
    assert [[tc.function.arguments for tc in p.message.tool_calls] for p in parts if p.message.tool_calls] == [
        [{"path": "a.py"}], [{"path": "b.py"}]]
    whole = await c.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], tools=tools)
    assert [tc.function.arguments for tc in whole.message.tool_calls] == [{"path": "a.py"}, {"path": "b.py"}]


async def test_tool_call_ids_go_out_and_come_back(client, scripted: ScriptedBackend):
    """Ollama gives each call an `id` (server/routes.go) and takes a tool message's `tool_call_id` (api/types.go):
    both ways, so a client that answers by id reaches the call it answers."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    scripted.script.tool_calls = [ToolCall("get_weather", {"city": "Paris"}, id="call_p4r1s000")]
    resp = await client.post("/api/chat", json={"model": "tiny", "stream": False, "tools": [weather],
                                                "messages": [{"role": "user", "content": "weather?"}]})
    [call] = (await resp.json())["message"]["tool_calls"]
    assert call == {"id": "call_p4r1s000", "function": {"index": 0, "name": "get_weather",
                                                        "arguments": {"city": "Paris"}}}
    scripted.script.tool_calls = []
    history = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "content": "sunny", "tool_call_id": "call_p4r1s000"}]
    assert (await client.post("/api/chat", json={"model": "tiny", "stream": False, "tools": [weather],
                                                 "messages": history})).status == 200
    sent = scripted.requests[-1].messages
    assert sent[1].tool_calls[0].id == sent[2].tool_call_id == "call_p4r1s000"


async def test_logprobs_reach_the_backend_and_come_back_in_ollamas_shape(base_url, scripted: ScriptedBackend):
    c = ollama.AsyncClient(host=base_url)
    out = await c.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2)
    assert [lp.token for lp in out.logprobs] == ["Hel", "lo", " world"]
    assert out.logprobs[0].top_logprobs[1].token == " x" and out.logprobs[0].logprob == -0.5
    assert (scripted.requests[-1].options.logprobs, scripted.requests[-1].options.top_logprobs) == (True, 2)
    parts = [p async for p in await c.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
                                           logprobs=True)]
    assert [lp.token for p in parts for lp in p.logprobs or []] == [p.message.content for p in parts][:3]
    plain = await c.generate(model="tiny", prompt="hi", stream=False, top_logprobs=3)  # alone, it asks nothing
    assert plain.logprobs is None and not scripted.requests[-1].options.logprobs
    with pytest.raises(ollama.ResponseError) as e:
        await c.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=21)
    assert (e.value.status_code, e.value.error) == (400, "top_logprobs must be between 0 and 20")


async def test_real_ollama_client_generate_fim_embed_tags_show(base_url, scripted: ScriptedBackend):
    c = ollama.AsyncClient(host=base_url)
    out = await c.generate(model="tiny", prompt="def f(", suffix="\n  return x", raw=True, stream=False,
                           options={"num_predict": 16})
    assert out.response == "Hello world" and out.done
    req = scripted.requests[-1]
    assert (req.prompt, req.suffix, req.raw, req.options.max_tokens) == ("def f(", "\n  return x", True, 16)
    emb = await c.embed(model="tiny", input=["a", "bbb"])
    assert [e[0] for e in emb.embeddings] == [1.0, 3.0]
    tags = await c.list()
    assert [m.model for m in tags.models] == ["tiny:latest"]
    assert tags.models[0].modified_at.timestamp() == 1714582800.123456  # the backend's time, passed through
    shown = await c.show("tiny")
    assert shown.modelinfo["llama.context_length"] == 8192 and "tools" in shown.capabilities
    [running] = (await c.ps()).models
    assert running.model == "tiny:latest" and running.expires_at.year > 2300  # loaded for good, as Ollama says it


async def test_generate_context_and_load_only(client, scripted: ScriptedBackend):
    resp = await client.post("/api/generate", json={"model": "tiny", "prompt": ""})
    assert (await resp.json())["done_reason"] == "load"
    resp = await client.post("/api/generate", json={"model": "tiny", "prompt": "", "keep_alive": 0})
    assert (await resp.json())["done_reason"] == "unload"
    assert scripted.requests == []  # loading is answered without generating
    resp = await client.post("/api/generate", json={"model": "tiny", "prompt": "x", "context": [1, 2], "stream": False})
    body = await resp.json()
    assert body["response"] == "Hello world" and scripted.requests[0].context == [1, 2]


async def test_an_empty_prompt_only_loads_whatever_else_the_generate_holds(client, scripted: ScriptedBackend):
    """GenerateHandler loads the model on an empty prompt (with keep_alive 0 unloads it), a suffix or images beside
    it too (server/routes.go `req.Prompt == ""`); Velo generated from the suffix or the images, and so answered a
    request to unload with a completion and left the model loaded."""
    for beside in ({"suffix": "    return x"}, {"images": ["aGVsbG8="]}):
        for keep, reason in ((None, "load"), (0, "unload")):
            resp = await client.post("/api/generate", json={"model": "tiny", "prompt": "", "keep_alive": keep,
                                                            "stream": False, **beside})
            assert (await resp.json())["done_reason"] == reason
    assert scripted.requests == []


async def test_an_empty_prompts_suffix_is_refused_by_a_model_that_cannot_insert(client, scripted):
    """GenerateHandler checks the model's capabilities, `insert` for a suffix, before it loads it."""
    scripted.capabilities = ["completion"]
    resp = await client.post("/api/generate", json={"model": "tiny", "prompt": "", "suffix": "x"})
    assert (resp.status, await resp.json()) == (400, {"error": '"tiny" does not support insert'})


async def test_the_ollama_clis_empty_suffix_system_and_template_are_none(client, scripted: ScriptedBackend):
    """`ollama run MODEL "prompt"` sends `suffix`, `system` and `template` empty with every prompt (api/types.go has
    no omitempty there): Ollama reads "" as none. Read as an empty template override, the prompt was lost."""
    resp = await client.post("/api/generate", json={"model": "tiny", "prompt": "Capital of France?", "suffix": "",
                                                    "system": "", "template": "", "stream": False})
    assert resp.status == 200
    req = scripted.requests[-1]
    assert (req.prompt, req.suffix, req.system, req.template) == ("Capital of France?", None, None, None)


async def test_tags_and_ps_entries_as_the_ollama_cli_reads_them(client):
    """A digest always (`ollama list`/`ps` print its first 12 characters, and panicked on an OpenAI-compatible
    server's empty one), the same in both; capabilities and the window, which `ollama launch` writes into the coding
    agents' settings (Codex was told 128k for an 8k model)."""
    [tag] = (await (await client.get("/api/tags")).json())["models"]
    [running] = (await (await client.get("/api/ps")).json())["models"]
    assert len(tag["digest"]) == 64 and int(tag["digest"], 16) and running["digest"] == tag["digest"]
    assert tag["capabilities"] == ["completion", "tools", "thinking", "insert", "vision"]
    assert tag["details"]["context_length"] == 8192 and "embedding_length" not in tag["details"]


@pytest.mark.parametrize("scripted", [ScriptedBackend(capabilities=("completion", "tools"))])
async def test_a_load_asking_a_model_that_cannot_think_to_think_is_a_400(client, scripted: ScriptedBackend):
    """`ollama run --think` sends `think` with its load request so that it fails before the prompt (cmd/cmd.go), as
    Ollama's load answers; else every message of the session failed."""
    for path, body in [("/api/generate", {"prompt": ""}), ("/api/chat", {"messages": []})]:
        resp = await client.post(path, json={"model": "tiny", "think": True, **body})
        assert resp.status == 400 and (await resp.json())["error"] == '"tiny" does not support thinking'
        off = await client.post(path, json={"model": "tiny", "think": False, **body})
        assert (await off.json())["done_reason"] == "load"
        unload = await client.post(path, json={"model": "tiny", "think": True, "keep_alive": 0, **body})
        assert (await unload.json())["done_reason"] == "unload"


async def test_roles_are_read_in_lower_case_and_an_empty_input_embeds_nothing(client, scripted):
    """As Ollama reads them (api/types.go Message.UnmarshalJSON; routes.go skips an empty input string): before,
    "SYSTEM" was no system prompt, and "" was embedded."""
    messages = [{"role": "SYSTEM", "content": "Reply in French"}, {"role": "User", "content": "hi"}]
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": messages, "stream": False})
    assert resp.status == 200 and [m.role for m in scripted.requests[0].messages] == ["system", "user"]
    for nothing in ({"input": ""}, {"input": []}, {}):  # Ollama loads the model and embeds nothing
        resp = await client.post("/api/embed", json={"model": "tiny", **nothing})
        assert resp.status == 200 and (await resp.json()) == {"model": "tiny", "embeddings": []}  # no figures
    assert len(scripted.requests) == 1  # no embedding call: llama-server refused an empty one with a 400


async def test_an_empty_last_assistant_turn_is_answered_as_without_it(client, scripted):
    """Ollama's templates leave the last assistant turn open, so an empty one prompts as a chat without it
    (`<|im_start|>assistant\n`); passed on, the engine's template closed it and opened another, and the model
    answered after an empty turn of its own."""
    user = {"role": "user", "content": "hi"}
    for messages in ([user, {"role": "assistant", "content": ""}], [{"role": "assistant", "content": ""}]):
        resp = await client.post("/api/chat", json={"model": "tiny", "messages": messages, "stream": False})
        assert resp.status == 200 and (await resp.json())["message"]["content"] == "Hello world"
    assert [m.role for m in scripted.requests[0].messages] == ["user"]
    assert [m.role for m in scripted.requests[1].messages] == ["assistant"]  # alone it is no load request


async def test_tags_lists_the_newest_first(client):
    """As Ollama does: a model just created comes first (before, presets came after every backend model)."""
    resp = await client.post("/api/create", json={"model": "pirate", "from": "tiny", "system": "Arr"})
    assert resp.status == 200
    names = [m["name"] for m in (await (await client.get("/api/tags")).json())["models"]]
    assert names[0] == "pirate:latest" and len(names) > 1


async def test_embed_dimensions_of_zero_or_less_ask_for_the_whole_vector(client, scripted):
    """EmbedHandler shortens only where 0 < dimensions (server/routes.go); Velo passed -1 on, which an
    OpenAI-compatible server refuses (OpenAI's and vLLM's 400) where Ollama answers the whole vector."""
    for dimensions in (-1, 0):
        resp = await client.post("/api/embed", json={"model": "tiny", "input": "a", "dimensions": dimensions})
        assert resp.status == 200
    assert [r.dimensions for r in scripted.requests] == [None, None]


async def test_legacy_embeddings_and_version_and_root(client):
    resp = await client.post("/api/embeddings", json={"model": "tiny", "prompt": "abcd"})
    assert (await resp.json())["embedding"][0] == 4.0
    assert (await (await client.get("/api/version")).json())["version"]
    root = await client.get("/")
    assert root.status == 200 and await root.text() == "Ollama is running"
    assert (await client.head("/")).status == 200


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b"", 400, "missing request body"),  # Ollama's words (server/routes.go); Velo said "request body is empty"
    (b" \n", 400, "missing request body"),
    (orjson.dumps({"messages": []}), 400, "model is required"),
    (orjson.dumps({"model": "tiny", "messages": "hi"}), 400, "messages must be an array"),
    (orjson.dumps({"model": "tiny", "messages": [{"content": "x"}]}), 400, "role is required"),
    (orjson.dumps({"model": "tiny", "messages": [], "options": {"temperature": "hot"}}), 400, "temperature"),
    (orjson.dumps({"model": "tiny", "messages": [], "stream": "yes"}), 400, "stream must be a boolean"),
    (orjson.dumps({"model": "tiny", "messages": [], "format": 5}), 400, "format"),
])
async def test_bad_chat_input_gets_ollama_error(client, scripted, body, status, fragment):
    resp = await client.post("/api/chat", data=body)
    assert resp.status == status
    err = await resp.json()
    assert set(err) == {"error"} and fragment in err["error"]
    assert scripted.requests == []


async def test_oversized_body_is_413_in_ollama_dialect(client):
    resp = await client.post("/api/chat", data=b'{"model": "tiny", "prompt": "' + b"x" * 70_000 + b'"}')
    assert resp.status == 413 and "larger than the limit" in (await resp.json())["error"]


async def test_unknown_route_and_method(client):
    resp = await client.get("/api/nothing")
    assert resp.status == 404 and "error" in await resp.json()
    resp = await client.get("/api/chat")
    assert resp.status == 405 and "POST" in (await resp.json())["error"]


async def test_mid_stream_failure_ends_with_error_line(client, scripted: ScriptedBackend):
    scripted.script.fail_after = 2
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    lines = [orjson.loads(line) for line in (await resp.read()).splitlines()]
    assert resp.status == 200 and lines[-1] == {"error": "scripted backend broke mid-stream"}


async def test_failure_before_first_chunk_is_an_http_error(client, scripted: ScriptedBackend):
    scripted.script.fail_after = 0
    resp = await client.post("/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status == 502 and "broke" in (await resp.json())["error"]


async def test_knobs_beside_options_are_heard_and_options_win(client, scripted):
    """ollama-ai-provider-v2 (Cherry Studio, AI SDK apps) sends temperature, top_p and max_output_tokens beside
    `options`, where Ollama ignores them: a limit of 20 gave 31 tokens. A value that is no number stays ignored."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False, "temperature": 0.3,
            "top_p": 0.5, "max_output_tokens": 20, "options": {"top_p": 0.7}}
    assert (await client.post("/api/chat", json=body)).status == 200
    assert (await client.post("/api/chat", json={**body, "temperature": "warm", "options": {}})).status == 200
    first, second = (r.options for r in scripted.requests)
    assert (first.temperature, first.top_p, first.max_tokens) == (0.3, 0.7, 20)
    assert (second.temperature, second.top_p) == (0.8, 0.5)  # Ollama's default where the value was no number


async def test_pull_and_push_without_an_ollama_backend(client, base_url):
    """A 400 in Ollama's shape that says where models come from (an OpenAI SDK would retry a 5xx); a model Velo
    already serves is "pulled" at once, as Codex's --oss pulls whatever it does not see listed."""
    for path in ("/api/pull", "/api/push"):
        resp = await client.post(path, json={"model": "llama3"})
        error = (await resp.json())["error"]
        assert resp.status == 400 and "Ollama backend" in error and "config.toml" in error
    resp = await client.post("/api/push", json={"model": "tiny:latest"})
    assert resp.status == 400
    c = ollama.AsyncClient(host=base_url)
    assert (await c.pull("tiny:latest")).status == "success"
    assert [p.status async for p in await c.pull("tiny:latest", stream=True)] == ["success"]
    # either spelling of a listed name: Open Interpreter pulls `name:latest` of one listed without a tag
    assert (await c.pull("tiny")).status == "success"
    # any name the router serves it by (router.py, as Ollama finds a model): one in another case was a 400
    assert (await c.pull("TINY")).status == "success" and (await c.pull("library/tiny:local")).status == "success"
    with pytest.raises(ollama.ResponseError) as e:
        await c.pull("llama3")
    assert e.value.status_code == 400


@pytest.mark.parametrize("think, status", [(True, 200), ("high", 200), ("max", 200), (False, 200), ("loud", 400),
                                           (3, 400)])
async def test_think_takes_a_switch_or_a_level(client, think, status):
    resp = await client.post("/api/chat", json={"model": "tiny", "think": think, "stream": False,
                                                "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == status


async def test_think_max_is_asked_as_high(client, scripted):
    """Ollama 0.22's "max" reaches the backend as "high", as Ollama sends it on (routes.go), so an older Ollama
    behind Velo does not refuse it."""
    resp = await client.post("/api/chat", json={"model": "tiny", "think": "max", "stream": False,
                                                "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 200 and scripted.requests[-1].think == "high"


@pytest.mark.parametrize("think, splits", [(None, True), (True, True), ("low", True), (False, False)])
async def test_only_think_false_leaves_a_think_block_in_the_text(client, scripted, think, splits):
    """As Ollama's ChatHandler and GenerateHandler (server/routes.go): their thinking parser runs when think is on,
    and unset is on for a model that thinks; `think: false` left the block in Ollama's text and not in Velo's."""
    asked = {} if think is None else {"think": think}
    chat, generate = {"messages": [{"role": "user", "content": "hi"}]}, {"prompt": "hi"}
    for path, body in (("/api/chat", chat), ("/api/generate", generate)):
        resp = await client.post(path, json={"model": "tiny", "stream": False, **asked, **body})
        assert resp.status == 200 and scripted.requests[-1].splits_thinking is splits


def test_show_carries_the_files_license():
    """`ollama show --license` and `/show license` print it; a GGUF names it in `general.license`."""
    assert show_object(ModelInfo(name="m", model_info={"general.license": "apache-2.0"}))["license"] == "apache-2.0"
    assert "license" not in show_object(ModelInfo(name="m"))


async def test_show_and_tags_leave_out_what_ollama_omits_when_empty(client, scripted: ScriptedBackend):
    """ShowResponse's license, modelfile, parameters, template, system and capabilities, and ListModelResponse's
    capabilities, are `omitempty` (api/types.go); Velo sent `"template": ""`, `"parameters": ""` and
    `"capabilities": []` for a model with none."""
    scripted.capabilities = []
    shown = await (await client.post("/api/show", json={"model": "tiny"})).json()
    assert not {"license", "parameters", "template", "system", "capabilities"} & set(shown)
    assert {"modelfile", "details", "model_info", "modified_at"} <= set(shown)
    [listed] = [m for m in (await (await client.get("/api/tags")).json())["models"] if m["name"] == "tiny:latest"]
    assert "capabilities" not in listed
    asked = await (await client.post("/api/show", json={"model": "tiny", "options": {"num_ctx": 4096}})).json()
    assert "parameters" not in asked and "PARAMETER num_ctx" in asked["modelfile"]  # the request's, there only


def test_a_token_that_is_part_of_a_character_gives_its_own_bytes():
    part = TokenLogprob("\ufffd", -0.1, [TokenLogprob("\ufffd", -0.1, raw=b"\xe6\x97")], raw=b"\xe6\x97")
    [entry] = generate_object("tiny", Chunk(logprobs=[part]), 0)["logprobs"]
    assert (entry["bytes"], entry["top_logprobs"][0]["bytes"]) == ([0xE6, 0x97], [0xE6, 0x97])


def test_a_tool_call_id_of_null_is_no_id():
    """It was the string "None": two such calls had one id, and the second's result was paired with the first."""
    from proxy.dialects.ollama import parse_message
    calls = [{"id": None, "function": {"name": "f", "arguments": {}}}, {"function": {"name": "g", "arguments": {}}},
             {"id": 7, "function": {"name": "h", "arguments": {}}}]
    message = parse_message({"role": "assistant", "content": "", "tool_calls": calls})
    assert [c.id for c in message.tool_calls] == ["", "", "7"]


async def test_a_tool_call_whose_arguments_are_null_is_a_call_without_arguments(client, scripted):
    """Go reads a null into the arguments' map as no arguments (api/types.go ToolCallFunctionArguments), so Ollama
    answers such a history; Velo refused it with a 400 "tool call arguments must be an object"."""
    call = {"function": {"name": "now", "arguments": None}}
    resp = await client.post("/api/chat", json={"model": "tiny", "stream": False, "messages": [
        {"role": "user", "content": "time?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "noon", "tool_name": "now"}]})
    assert resp.status == 200, await resp.text()
    assert [(c.name, c.arguments) for c in scripted.requests[0].messages[1].tool_calls] == [("now", {})]


async def test_a_model_that_only_embeds_is_refused_a_chat_or_a_generation_as_ollama_refuses_it():
    """Its bare load answered "load", and a chat went to the backend: Ollama answers 400 `"emb" does not support
    chat` (or `generate`) before loading it. Its embeddings' own bare load still loads."""
    from aiohttp.test_utils import TestClient, TestServer

    from proxy.app import make_app
    from proxy.config import Config
    from tests.scripted import ScriptedBackend
    emb = ScriptedBackend("e", models=("emb:latest",), capabilities=("embedding",))
    async with TestClient(TestServer(make_app(Config(), {"e": emb}))) as c:
        for path, body, word in (("/api/generate", {"model": "emb"}, "generate"),
                                 ("/api/chat", {"model": "emb", "messages": []}, "chat"),
                                 ("/api/chat", {"model": "emb", "stream": False,
                                                "messages": [{"role": "user", "content": "hi"}]}, "chat"),
                                 ("/api/generate", {"model": "emb", "prompt": "hi", "stream": False}, "generate")):
            resp = await c.post(path, json=body)
            assert resp.status == 400 and (await resp.json())["error"] == f'"emb" does not support {word}'
        assert (await c.post("/api/embed", json={"model": "emb"})).status == 200
    assert not [r for r in emb.requests if not hasattr(r, "inputs")]


async def test_a_model_that_only_embeds_loads_on_ollama_as_its_embed_handler_loads_it():
    """GenerateHandler refuses such a model even a bare load (`"x" does not support generate`, server/routes.go), and
    Velo loaded every model through it: /api/embed without input and /api/embeddings with an empty prompt, which
    Ollama answers by loading the model, were that 400 for an embedding model on an Ollama backend."""
    from aiohttp.test_utils import TestClient, TestServer

    from adapters.base import BackendConfig
    from proxy.app import make_app
    from proxy.cache.config import CacheConfig
    from proxy.config import Config
    from tests.fakes import OllamaDouble
    async with OllamaDouble() as fake:
        fake.models["all-minilm:latest"].capabilities = ["embedding"]
        cfg = Config(backends=[BackendConfig(name="up", kind="ollama", urls=[fake.url])],
                     cache=CacheConfig(enabled=False))
        async with TestClient(TestServer(make_app(cfg))) as c:
            embed = await c.post("/api/embed", json={"model": "all-minilm", "keep_alive": "10m"})
            assert (embed.status, await embed.json()) == (200, {"model": "all-minilm", "embeddings": []})
            legacy = await c.post("/api/embeddings", json={"model": "all-minilm", "prompt": ""})
            assert (legacy.status, await legacy.json()) == (200, {"embedding": []})
            assert fake.last("/api/embed") == {"model": "all-minilm:latest"}
            unload = await c.post("/api/embed", json={"model": "all-minilm", "keep_alive": 0})  # as Ollama unloads
            assert unload.status == 200
            assert fake.last("/api/generate") == {"model": "all-minilm:latest", "keep_alive": 0}


async def test_ps_shows_the_others_when_a_backend_does_not_answer():
    """Each backend was asked in turn with no limit: one that hung held /api/ps for its total_timeout. It is waited
    for as long as the router waits for a listing."""
    from aiohttp.test_utils import TestClient, TestServer

    from proxy.app import make_app
    from proxy.config import Config
    from proxy.state import GENERATIONS
    hung, fine = ScriptedBackend("hung"), ScriptedBackend("fine", models=("other:latest",))

    async def hangs() -> list:
        await asyncio.Event().wait()
        return []
    hung.running = hangs  # type: ignore[method-assign]
    async with TestClient(TestServer(make_app(Config(), {"hung": hung, "fine": fine}))) as c:
        c.server.app[GENERATIONS].current.router.listing_timeout = 0.2
        shown = await asyncio.wait_for(c.get("/api/ps"), 5)
        assert shown.status == 200 and isinstance((await shown.json())["models"], list)


async def test_total_duration_counts_the_wait_in_velos_queue():
    """Ollama's total is from its handler's start (server/routes.go); an Ollama behind Velo times only its own part,
    and a request that waited in Velo's queue (max_concurrency) said it took no longer than one that did not."""
    from aiohttp.test_utils import TestServer

    from adapters.base import BackendConfig
    from proxy.app import make_app
    from proxy.cache.config import CacheConfig
    from proxy.config import Config
    from tests.fakes import OllamaDouble

    async with OllamaDouble() as fake:
        fake.script.token_delay = 0.1
        cfg = Config(backends=[BackendConfig(name="up", kind="ollama", urls=[fake.url], max_concurrency=1)],
                     cache=CacheConfig(enabled=False))
        server = TestServer(make_app(cfg), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            oll = ollama.AsyncClient(host=str(server.make_url("")).rstrip("/"))
            answers = await asyncio.gather(*(oll.chat(model="smollm2:135m", options={"num_predict": 3}, messages=[
                {"role": "user", "content": f"question {i}"}]) for i in range(2)))
        finally:
            await server.close()
    first, second = sorted(a.total_duration for a in answers)
    assert second > 1.7 * first, (first, second)  # the second waited for the first's whole answer


async def test_ps_lists_the_model_with_the_longest_left_first():
    """PsHandler sorts by expires_at, latest first (server/routes.go), and `ollama ps` prints that order; Velo listed
    backend after backend."""
    from aiohttp.test_utils import TestClient, TestServer

    from adapters.protocol import RunningModel
    from proxy.app import make_app
    from proxy.config import Config
    one, two = ScriptedBackend("one", models=("one:latest",)), ScriptedBackend("two", models=("two:latest",))

    async def running_one() -> list[RunningModel]:
        return [RunningModel("one:latest", expires_at="2030-01-01T01:00:00+02:00")]  # 23:00Z, the day before

    async def running_two() -> list[RunningModel]:
        return [RunningModel("two:latest", expires_at="2030-01-01T00:00:00Z")]
    one.running, two.running = running_one, running_two  # type: ignore[method-assign]
    for backends in ({"one": one, "two": two}, {"two": two, "one": one}):
        async with TestClient(TestServer(make_app(Config(), backends))) as c:
            shown = await (await c.get("/api/ps")).json()
        assert [m["name"] for m in shown["models"]] == ["two:latest", "one:latest"]
