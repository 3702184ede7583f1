"""The fit stage: the default output limit, the thinking switch per dialect, and the context window at its
boundary (one token under and over, with and without a system prompt) in every dialect's own terms."""
from __future__ import annotations

import os

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.protocol import ChatRequest, Message, ToolCall
from proxy.app import make_app
from proxy.config import Config, ServerConfig
from proxy.stages import fit
from tests.scripted import ScriptedBackend

LIMIT = 50  # the scripted model's context; it counts one token per word plus one per message


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


@pytest.fixture
async def velo():
    """A client of Velo over a scripted model with a 50-token context that can think."""
    backends: list[ScriptedBackend] = []

    async def start(config: Config | None = None, **kw) -> tuple[TestClient, ScriptedBackend]:
        backend = ScriptedBackend("s", **{"context_length": LIMIT, **kw})
        backends.append(backend)
        client = TestClient(TestServer(make_app(config or Config(), {"s": backend})))
        await client.start_server()
        clients.append(client)
        return client, backend
    clients: list[TestClient] = []
    yield start
    for c in clients:
        await c.close()


def chat(n_tokens: int, system: bool) -> list[dict]:
    """A conversation of exactly n_tokens by the scripted count: an optional system turn, history, a last turn."""
    head = [{"role": "system", "content": words(4, "s")}] if system else []  # 5 tokens
    last = {"role": "user", "content": words(9, "q")}  # 10 tokens
    rest = n_tokens - 10 - (5 if system else 0) - 2  # two history turns of one token of overhead each
    history = [{"role": "user", "content": words(rest // 2, "a")},
               {"role": "assistant", "content": words(rest - rest // 2, "b")}]
    return head + history + [last]


@pytest.mark.parametrize("system", [False, True])
async def test_one_token_under_the_window_passes_untouched_in_every_dialect(velo, system):
    c, backend = await velo()
    messages = chat(LIMIT - 1, system)
    assert (await c.post("/api/chat", json={"model": "tiny", "messages": messages, "stream": False})).status == 200
    assert (await c.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})).status == 200
    assert len(backend.requests[0].messages) == len(messages) == len(backend.requests[1].messages)


@pytest.mark.parametrize("system", [False, True])
async def test_ollama_drops_the_oldest_turns_one_token_over(velo, system):
    c, backend = await velo()
    messages = chat(LIMIT, system)
    resp = await c.post("/api/chat", json={"model": "tiny", "messages": messages, "stream": False,
                                           "options": {"num_predict": 5}})
    assert resp.status == 200 and resp.headers["X-Velo-Context-Trimmed"].startswith("1 message (50 -> ")
    sent = backend.requests[0].messages
    assert [m.content for m in sent] == [m["content"] for m in messages if m["content"] not in
                                         (messages[-3]["content"],)]  # the oldest non-system turn went
    assert sent[-1].content == messages[-1]["content"] and (sent[0].role == "system") == system


async def trimmed(c: TestClient, backend: ScriptedBackend, messages: list[dict]) -> tuple[str, list]:
    """What an Ollama chat over the window lost (the trim header) and the messages the model got, which leave room
    for the answer; asked with `shift: false`, the same chat is Ollama's 400 and reaches no model."""
    resp = await c.post("/api/chat", json={"model": "tiny", "messages": messages, "stream": False,
                                           "options": {"num_predict": 5}})
    assert resp.status == 200 and len(backend.requests) == 1
    assert await backend.count_tokens(backend.requests[0]) <= LIMIT - 5
    unshifted = await c.post("/api/chat", json={"model": "tiny", "messages": messages, "stream": False,
                                                "shift": False})
    assert unshifted.status == 400 and "context window of 50 tokens" in (await unshifted.json())["error"]
    assert len(backend.requests) == 1
    return resp.headers["X-Velo-Context-Trimmed"], backend.requests[0].messages


async def test_ollama_keeps_the_end_of_a_last_turn_that_alone_overflows(velo):
    """A whole file pasted into one message: Ollama keeps the prompt's end (llm/llama_server.go), and so does Velo,
    with the system prompt whole."""
    c, backend = await velo()
    went, (system, last) = await trimmed(c, backend, [{"role": "system", "content": words(10, "s")},
                                                      {"role": "user", "content": words(60, "q")}])
    assert "characters of the last (72 -> " in went
    assert system.content == words(10, "s") and words(60, "q").endswith(last.content) and "q59" in last.content


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
async def test_a_trim_keeps_the_call_an_agents_last_tool_result_answers(velo, path):
    """An agent's loop ends in a tool result: trimmed to fit, it kept the result and dropped its call, which vLLM
    refuses (a tool message with no preceding tool_calls) and templates choke on."""
    c, backend = await velo()

    def call(i: int) -> dict:  # Ollama's arguments are an object, OpenAI's a JSON string
        return {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
            "name": "read", "arguments": {} if path == "/api/chat" else "{}"}}]}
    messages = [{"role": "system", "content": words(4, "s")}, {"role": "user", "content": words(5, "u")},
                call(1), {"role": "tool", "tool_call_id": "c1", "content": words(8, "r")},
                call(2), {"role": "tool", "tool_call_id": "c2", "content": words(40, "t")}]
    resp = await c.post(path, json={"model": "tiny", "messages": messages, "stream": False, "truncate": True,
                                    "max_tokens": 5, "options": {"num_predict": 5}})
    assert resp.status == 200 and resp.headers["X-Velo-Context-Trimmed"].startswith("3 messages and ")
    sent = backend.requests[0].messages
    assert [m.role for m in sent] == ["system", "assistant", "tool"] and sent[1].tool_calls[0].id == "c2"
    assert sent[2].tool_call_id == "c2" and sent[2].content.endswith("t39")


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
async def test_a_trim_cuts_the_longest_tool_results_to_one_length_and_keeps_the_short_whole(velo, path):
    """An agent's loop read two files, each larger than the window, and ran a command that failed: only the last
    message's start could be cut, and the turn was a 400 context overflow. The two files are now cut to one length,
    each keeping its end (a file's last lines, a command's last output), the short error whole, with the call and
    the system prompt whole."""
    c, backend = await velo(context_length=512)
    results = [words(n, tag) for n, tag in ((600, "a"), (12, "e"), (900, "c"))]
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
        "name": "read", "arguments": {} if path == "/api/chat" else "{}"}} for i in range(3)]}
    messages = [{"role": "system", "content": words(4, "s")}, {"role": "user", "content": words(5, "u")}, call,
                *({"role": "tool", "tool_call_id": f"c{i}", "content": r} for i, r in enumerate(results))]
    resp = await c.post(path, json={"model": "tiny", "messages": messages, "stream": False, "truncate": True,
                                    "max_tokens": 5, "options": {"num_predict": 5}})
    assert resp.status == 200, await resp.text()
    assert resp.headers["X-Velo-Context-Trimmed"].startswith("1 message and ")
    assert "of the last 2 tool results" in resp.headers["X-Velo-Context-Trimmed"]
    sent = backend.requests[0].messages
    assert [m.role for m in sent] == ["system", "assistant", "tool", "tool", "tool"] and len(sent[1].tool_calls) == 3
    assert await backend.count_tokens(backend.requests[0]) <= 512 - 5
    kept = [m.content for m in sent[2:]]
    assert all(r.endswith(k) and k for r, k in zip(results, kept)) and [k.split()[-1] for k in kept] == [
        "a599", "e11", "c899"]
    assert kept[1] == results[1] and len(kept[0]) == len(kept[2]) < len(results[0])


def test_level_keeps_the_short_whole_and_cuts_the_rest_to_one_length():
    assert fit._level([10, 6000, 6000], 410) == 200
    assert fit._level([300, 300], 600) == 300 and fit._level([300, 300], 599) == 299
    assert fit._level([5, 7], 3) == 1


def test_trimming_a_long_agent_loop_finds_its_last_turn_once(monkeypatch):
    """Dropping the oldest turns of a 2,000-message agent loop looked for the last turn again (and copied the chat
    up to it) for each turn it dropped: quadratic, 7 ms for 2,000 messages and 0.9 s for 20,000."""
    looked, last_turn = [], fit._last_turn
    monkeypatch.setattr(fit, "_last_turn", lambda messages: looked.append(1) or last_turn(messages))
    loop = [m for i in range(1000) for m in (
        Message("assistant", tool_calls=[ToolCall("ls", {}, f"c{i}")]), Message("tool", words(3, f"r{i}_")))]
    sent = fit._shorter(ChatRequest("tiny", [Message("system", "s"), *loop]), 0.1)
    assert sent is not None and len(sent.messages) < 300 and len(looked) == 1
    assert sent.messages[0].content == "s" and sent.messages[1].role == "assistant" and sent.messages[-1] == loop[-1]


async def test_ollama_keeps_the_end_of_system_prompts_that_alone_overflow(velo):
    """An agent's system prompt and tools over a small num_ctx: Ollama's runner keeps the prompt's end and answers
    (a 400 failed every turn of Roo Code and Cline), and so does Velo, with the last turn whole; `shift: false`
    still asks for the 400."""
    c, backend = await velo()
    went, (system, last) = await trimmed(c, backend, [{"role": "system", "content": words(30, "a")},
                                                      {"role": "system", "content": words(40, "s")},
                                                      {"role": "user", "content": words(3, "q")}])
    assert "characters of the system prompts" in went
    assert last.content == words(3, "q") and words(40, "s").endswith(system.content) and "s39" in system.content


async def test_ollama_truncate_false_answers_400_instead(velo):
    """Ollama's `truncate: false` (api/types.go): a prompt past the window is an error, not a shorter prompt; the
    model is not called. `true` is the default's trim."""
    c, backend = await velo()
    body = {"model": "tiny", "messages": chat(LIMIT, False), "stream": False, "options": {"num_predict": 5}}
    resp = await c.post("/api/chat", json={**body, "truncate": False})
    assert resp.status == 400 and "context window of 50 tokens" in (await resp.json())["error"]
    resp = await c.post("/api/generate", json={"model": "tiny", "prompt": words(70), "raw": True, "stream": False,
                                               "truncate": False})
    assert resp.status == 400 and backend.requests == []
    resp = await c.post("/api/chat", json={**body, "truncate": True})
    assert resp.status == 200 and "X-Velo-Context-Trimmed" in resp.headers
    bad = await c.post("/api/chat", json={**body, "truncate": "no"})
    assert bad.status == 400 and "truncate" in (await bad.json())["error"]


async def test_num_ctx_narrows_the_window(velo):
    c, backend = await velo()
    resp = await c.post("/api/chat", json={"model": "tiny", "messages": chat(40, False), "stream": False,
                                           "options": {"num_ctx": 30, "num_predict": 5}})
    assert resp.status == 200 and "X-Velo-Context-Trimmed" in resp.headers
    assert await backend.count_tokens(backend.requests[0]) <= 30 - 5


@pytest.mark.parametrize("trained", [None, 200])
async def test_a_num_ctx_that_would_hold_the_prompt_is_a_400_where_the_backend_cannot_give_it(velo, trained):
    """Aider sizes num_ctx to hold its prompt (a file to edit) and Ollama loads the model with it; a llama-server
    slot cannot grow, and a trim dropped the file, whose place Aider then filled with the model's guess. Where the
    prompt would overflow num_ctx too, Ollama trims, and so does Velo."""
    c, backend = await velo(trained_context=trained)
    body = {"model": "tiny", "messages": chat(70, False), "stream": False, "options": {"num_ctx": 100}}
    resp = await c.post("/api/chat", json=body)
    assert resp.status == 400 and backend.requests == []
    assert (await resp.json())["error"] == ("the prompt is 70 tokens, more than the context window of 50 tokens, which "
                                            "num_ctx 100 would hold but the backend cannot give (a llama-server slot "
                                            "is its -c over its -np)")
    over = await c.post("/api/chat", json={**body, "options": {"num_ctx": 60, "num_predict": 5}})
    assert over.status == 200 and "X-Velo-Context-Trimmed" in over.headers


async def test_a_num_ctx_past_the_models_trained_context_is_capped_there_as_ollama_caps_it(velo):
    c, backend = await velo(trained_context=LIMIT)
    resp = await c.post("/api/chat", json={"model": "tiny", "messages": chat(70, False), "stream": False,
                                           "options": {"num_ctx": 100, "num_predict": 5}})
    assert resp.status == 200 and "X-Velo-Context-Trimmed" in resp.headers
    assert await backend.count_tokens(backend.requests[0]) <= LIMIT - 5


async def test_num_ctx_does_not_invent_a_window_the_backend_lists_none_of(velo):
    """An OpenAI-compatible server that lists no context cannot apply num_ctx either: the prompt goes on whole and
    the server answers for its own window (Zed sends a fallback 4096 for a model whose /api/show has none)."""
    c, backend = await velo(context_length=None)
    messages = chat(40, False)
    resp = await c.post("/api/chat", json={"model": "tiny", "messages": messages, "stream": False,
                                           "options": {"num_ctx": 30, "num_predict": 5}})
    assert resp.status == 200 and "X-Velo-Context-Trimmed" not in resp.headers
    assert len(backend.requests[0].messages) == len(messages)


async def test_generate_trims_the_start_of_a_raw_prompt(velo):
    c, backend = await velo()
    prompt = words(70)
    resp = await c.post("/api/generate", json={"model": "tiny", "prompt": prompt, "raw": True, "stream": False,
                                               "options": {"num_predict": 5}})
    assert resp.status == 200 and "characters" in resp.headers["X-Velo-Context-Trimmed"]
    sent = backend.requests[0].prompt
    assert prompt.endswith(sent) and len(sent.split()) <= LIMIT - 5


@pytest.mark.parametrize("ids, prompt, trimmed", [
    (60, 10, "25 token ids of the context (70 -> 45 tokens)"),
    (10, 50, "10 token ids of the context and 28 characters (60 -> 41 tokens)")])
async def test_generate_drops_the_oldest_of_its_context_first(velo, ids, prompt, trimmed):
    """An /api/generate's `context` (the ids of the exchanges before, sent back by Ollama's stateful clients) goes
    before its prompt, and Ollama keeps the end of the whole. Its ids were not counted: 60 of them and a prompt of
    10 words went to a 50-token window whole, "surely under" by the prompt's text alone."""
    c, backend = await velo()
    context = list(range(100, 100 + ids))
    resp = await c.post("/api/generate", json={"model": "tiny", "prompt": words(prompt), "context": context,
                                               "stream": False, "options": {"num_predict": 5}})
    assert resp.status == 200, await resp.text()
    sent = backend.requests[0]
    assert context[len(context) - len(sent.context):] == sent.context and words(prompt).endswith(sent.prompt)
    assert resp.headers["X-Velo-Context-Trimmed"] == trimmed and await backend.count_tokens(sent) <= LIMIT - 5


@pytest.mark.parametrize("num_keep", [10, 10.0, -1])
async def test_generate_keeps_the_first_num_keep_tokens_of_a_raw_prompt(velo, num_keep):
    """Ollama's runner keeps a prompt's first `num_keep` tokens and drops those right after them (for -1, the start
    as far as it fits: the end goes), llm/llama_server.go; Velo dropped the start whatever num_keep said. Text's token
    boundaries are not known to the fit stage: 4 characters a token, at least num_keep of these 2-4 character words."""
    c, backend = await velo()
    prompt = words(70)
    resp = await c.post("/api/generate", json={"model": "tiny", "prompt": prompt, "raw": True, "stream": False,
                                               "options": {"num_predict": 5, "num_keep": num_keep}})
    assert resp.status == 200 and "characters" in resp.headers["X-Velo-Context-Trimmed"]
    sent = backend.requests[0].prompt
    head = len(os.path.commonprefix([sent, prompt]))
    assert len(sent.split()) <= LIMIT - 5 and prompt.endswith(sent[head:])
    if num_keep < 0:
        assert prompt.startswith(sent) and len(sent.split()) > 30
    else:
        assert sent.startswith(words(10) + " ") and sent.endswith(" w69")


async def test_generate_keeps_the_first_num_keep_ids_of_its_context(velo):
    """With a `context` longer than num_keep, the ids after its first num_keep go first, then the rest of the
    context and the prompt's start, as Ollama's runner cuts the whole it renders (context's text first)."""
    c, backend = await velo()
    context = list(range(100, 160))
    resp = await c.post("/api/generate", json={"model": "tiny", "prompt": words(10), "context": context,
                                               "stream": False, "options": {"num_predict": 5, "num_keep": 5}})
    assert resp.status == 200, await resp.text()
    sent = backend.requests[0]
    assert sent.context == context[:5] + context[30:] and sent.prompt == words(10)
    assert resp.headers["X-Velo-Context-Trimmed"] == "25 token ids of the context (70 -> 45 tokens)"


async def test_a_completions_prompt_of_token_ids_keeps_its_first_num_keep(velo):
    """Token ids are cut exactly: the first num_keep stay, and those right after them go (Ollama's options object on
    /v1/completions, with `truncate: true`)."""
    c, backend = await velo()
    ids = list(range(100, 160))
    resp = await c.post("/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 5, "truncate": True,
                                                 "options": {"num_keep": 5}})
    assert resp.status == 200, await resp.text()
    assert backend.requests[0].prompt_ids == ids[:5] + ids[20:]
    assert resp.headers["X-Velo-Context-Trimmed"] == "15 token ids (60 -> 45 tokens)"


@pytest.mark.parametrize("prompt, num_keep", [(f"[img-0] {words(70)}", None), (f"describe [img-0] {words(70)}", 3)],
                         ids=["start", "num_keep"])
async def test_a_raw_prompt_whose_tags_place_images_is_not_trimmed(velo, prompt, num_keep):
    """Ollama cuts no prompt with images (llm/llama_server.go completionPromptForRequest, since v0.30.0), and
    llama-server, whose projector turns its context shift off, refuses one over its window with a 400. A cut of the
    text lost the image ahead of it, or left "describe [im" and the rest of the tag as text. A raw prompt without a
    tag sends no image (adapters/llamacpp.py `_tagged`), and its text is cut as any."""
    c, backend = await velo()
    options = {"num_predict": 5} if num_keep is None else {"num_predict": 5, "num_keep": num_keep}
    resp = await c.post("/api/generate", json={"model": "tiny", "prompt": prompt, "raw": True, "images": ["aGk="],
                                               "stream": False, "options": options})
    assert resp.status == 400 and "context window of 50 tokens" in (await resp.json())["error"]
    assert backend.requests == []
    untagged = await c.post("/api/generate", json={"model": "tiny", "prompt": words(70), "raw": True,
                                                   "images": ["aGk="], "stream": False, "options": options})
    assert untagged.status == 200 and "characters" in untagged.headers["X-Velo-Context-Trimmed"]


async def test_generate_with_a_context_over_the_window_and_truncate_false_is_a_400(velo):
    c, backend = await velo()
    resp = await c.post("/api/generate", json={"model": "tiny", "prompt": "hi", "context": list(range(60)),
                                               "stream": False, "truncate": False})
    assert resp.status == 400 and "61" in (await resp.json())["error"] and backend.requests == []


async def test_openai_answers_context_length_exceeded_one_token_over(velo):
    c, backend = await velo()
    resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": chat(LIMIT, True)})
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert err["message"] == ("This model's maximum context length is 50 tokens. However, your messages resulted "
                              "in 50 tokens. Please reduce the length of the messages.")
    assert backend.requests == []


async def test_openai_chat_asking_truncate_is_trimmed_as_ollamas_v1_trims(velo):
    """Ollama's /v1 drops the oldest turns and answers; LibreChat, which guesses a window by the model's name, relies
    on it, and its `addParams` can send Ollama's `truncate` (a 400 every turn once a chat outgrew the window)."""
    c, backend = await velo()
    resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": chat(LIMIT, True),
                                                      "max_tokens": 5, "truncate": True})
    assert resp.status == 200 and resp.headers["X-Velo-Context-Trimmed"].startswith("1 message (50 -> ")
    assert await backend.count_tokens(backend.requests[0]) <= LIMIT - 5
    bad = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": chat(10, True), "truncate": "yes"})
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "truncate"


async def test_a_chat_of_many_short_turns_is_counted_not_guessed_under_the_window(velo):
    """An agent's long loop of short calls and results is mostly the template's tokens around each message: judged
    by its characters alone it was "surely under" the window, and went to the backend unfitted, with no 400 and no
    trim."""
    c, backend = await velo()
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "ok"} for i in range(41)]  # 82 tokens
    resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "context_length_exceeded"
    resp = await c.post("/api/chat", json={"model": "tiny", "messages": messages, "stream": False,
                                           "options": {"num_predict": 5}})
    assert resp.status == 200 and "X-Velo-Context-Trimmed" in resp.headers
    assert await backend.count_tokens(backend.requests[0]) <= LIMIT - 5


async def test_a_completions_overflow_names_the_prompt(velo):
    """/v1/completions has no `messages`: the overflow names `prompt` (it named `messages`)."""
    c, _ = await velo()
    resp = await c.post("/v1/completions", json={"model": "tiny", "prompt": words(60)})
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert "your prompt resulted in 60 tokens" in err["message"]


async def test_responses_and_anthropic_word_the_overflow_their_way(velo):
    c, _ = await velo()
    resp = await c.post("/v1/responses", json={"model": "tiny", "input": words(60)})
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["code"] == "context_length_exceeded" and "context window" in err["message"]
    assert err["param"] == "input"
    resp = await c.post("/v1/messages", json={"model": "tiny", "max_tokens": 5,
                                              "messages": [{"role": "user", "content": words(60)}]})
    assert resp.status == 400 and (await resp.json())["error"] == {
        "type": "invalid_request_error", "message": "prompt is too long: 61 tokens > 50 maximum"}


async def test_a_streamed_responses_turn_fails_in_its_stream_where_codex_reads_an_overflow(velo):
    """Codex compacts on `response.failed` with code context_length_exceeded; a 400 ends its turn instead. An
    `error` event comes first: the AI SDK drops `response.failed` (an empty answer, no error), and raises on it."""
    c, backend = await velo()
    resp = await c.post("/v1/responses", json={"model": "tiny", "input": words(60), "stream": True})
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    events = [orjson.loads(block.split("data: ", 1)[1]) for block in (await resp.text()).split("\n\n") if block]
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    said = "Your input exceeds the context window of this model. Please adjust your input and try again."
    assert events[-1]["response"]["status"] == "failed" and events[-1]["response"]["error"] == {
        "code": "context_length_exceeded", "message": said}
    error = events[2]  # OpenAI's fields at its top, and under `error` with a type, as the AI SDK's schema has them
    assert (error["code"], error["message"], error["param"]) == ("context_length_exceeded", said, "input")
    assert error["error"] == {"type": "invalid_request_error", "code": "context_length_exceeded", "message": said,
                              "param": "input"}
    assert backend.requests == []


async def test_responses_truncation_auto_drops_the_oldest_turns_instead(velo):
    """OpenAI's `truncation: "auto"`: the turns that do not fit go (X-Velo-Context-Trimmed says how many), where
    "disabled", the default, is the 400 above."""
    c, backend = await velo()
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": words(9, f"t{i}")} for i in range(6)]
    body = {"model": "tiny", "input": history + [{"role": "user", "content": words(9, "q")}]}
    assert (await c.post("/v1/responses", json=body)).status == 400
    resp = await c.post("/v1/responses", json={**body, "truncation": "auto"})
    assert resp.status == 200 and resp.headers["X-Velo-Context-Trimmed"].startswith("4 messages")
    sent = backend.requests[-1].messages
    assert sent[-1].content == words(9, "q") and sent[0].content != words(9, "t0")
    assert (await resp.json())["truncation"] == "auto"
    bad = await c.post("/v1/responses", json={**body, "truncation": "sometimes"})
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "truncation"


async def test_requests_without_an_output_limit_get_the_default(velo):
    c, backend = await velo(Config(server=ServerConfig(default_max_tokens=77)))
    await c.post("/api/chat", json={"model": "tiny", "messages": chat(20, False), "stream": False})
    await c.post("/api/chat", json={"model": "tiny", "messages": chat(20, False), "stream": False,
                                    "options": {"num_predict": 5}})
    assert [r.options.max_tokens for r in backend.requests] == [77, 5]
    c2, backend2 = await velo(Config(server=ServerConfig(default_max_tokens=0)))
    await c2.post("/v1/chat/completions", json={"model": "tiny", "messages": chat(20, False)})
    assert backend2.requests[0].options.max_tokens is None


async def test_ollamas_until_done_and_fill_the_context_run_to_the_windows_end(velo):
    """num_predict -1 and -2 (n8n's and Dify's "until done"): to the window's end (num_ctx's, where smaller), which
    bounds them; where Velo knows no window, to the backend's own limit. Before, the default cap stood in."""
    c, backend = await velo(Config(server=ServerConfig(default_max_tokens=30)))
    for options in ({"num_predict": -1}, {"num_predict": -2}, {"num_predict": -1, "num_ctx": LIMIT // 2},
                    {"num_predict": 0}):  # Ollama's runners stop only at a limit above 0; llama-server at once
        await c.post("/api/chat", json={"model": "tiny", "messages": chat(5, False), "stream": False,
                                        "options": options})
    assert [r.options.max_tokens for r in backend.requests] == [LIMIT, LIMIT, LIMIT // 2, LIMIT]
    c2, unknown = await velo(Config(server=ServerConfig(default_max_tokens=30)), context_length=None)
    await c2.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                         "options": {"num_predict": -1}})
    assert unknown.requests[0].options.max_tokens is None


async def test_an_output_limit_past_the_window_is_cut_where_the_server_would_refuse_it(velo):
    """vLLM and SGLang refuse a prompt whose max_tokens reaches past the window, where the engine, llama-server and
    Ollama stop at its end: there Velo's default and a client's own limit (opencode sends 32000) are cut to what the
    window leaves; a limit inside the window goes as sent, and a server that stops at the end gets it whole."""
    c, backend = await velo(Config(server=ServerConfig(default_max_tokens=30)))
    backend.refuses_output_past_window = True
    await c.post("/v1/chat/completions", json={"model": "tiny", "messages": chat(30, False)})
    await c.post("/v1/chat/completions", json={"model": "tiny", "messages": chat(14, False)})
    await c.post("/v1/chat/completions", json={"model": "tiny", "messages": chat(14, False), "max_tokens": 35})
    await c.post("/v1/chat/completions", json={"model": "tiny", "messages": chat(30, False), "max_tokens": 32000})
    await c.post("/api/chat", json={"model": "tiny", "messages": chat(60, False), "stream": False})
    limits = [r.options.max_tokens for r in backend.requests]
    assert limits[:4] == [LIMIT - 30, 30, 35, LIMIT - 30]
    assert limits[4] == LIMIT - await backend.count_tokens(backend.requests[4])  # trimmed, then cut to what is left
    c2, backend2 = await velo(Config(server=ServerConfig(default_max_tokens=30)))
    await c2.post("/v1/chat/completions", json={"model": "tiny", "messages": chat(30, False)})
    assert backend2.requests[0].options.max_tokens == 30


@pytest.mark.parametrize("path, body, strict", [
    ("/api/chat", {"think": True, "stream": False}, True),
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 100}, "max_tokens": 9}, False),
    ("/v1/responses", {"reasoning": {"effort": "high"}}, False),
])
async def test_thinking_on_a_model_that_cannot_think(velo, path, body, strict):
    c, backend = await velo(capabilities=("completion", "tools"))
    shape = {"input": "hi"} if path == "/v1/responses" else {"messages": [{"role": "user", "content": "hi"}]}
    resp = await c.post(path, json={"model": "tiny", **shape, **body})
    if strict:
        assert resp.status == 400 and (await resp.json()) == {"error": '"tiny" does not support thinking'}
    else:
        assert resp.status == 200 and backend.requests[0].think is None


async def test_reasoning_effort_on_a_model_that_cannot_think_is_the_400_naming_it(velo):
    """OpenAI's error names the field it refuses; the error every dialect shares named `model`."""
    c, _ = await velo(capabilities=("completion", "tools"))
    resp = await c.post("/v1/chat/completions", json={"model": "tiny", "reasoning_effort": "high",
                                                      "messages": [{"role": "user", "content": "hi"}]})
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["param"] == "reasoning_effort" and "does not support thinking" in err["message"]


PNG = "iVBORw0KGgo="  # base64 of a PNG signature: the scripted model never decodes it
READ_A_PICTURE = {"max_tokens": 9, "messages": [  # Claude Code's Read of an image file
    {"role": "user", "content": "read cat.png"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                       "input": {"file_path": "cat.png"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
        {"type": "text", "text": "cat.png"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}]}]}


@pytest.mark.parametrize("path, body, strict", [
    ("/api/chat", {"messages": [{"role": "user", "content": "what is this", "images": [PNG]}], "stream": False},
     False),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}]}, True),
    ("/v1/messages", READ_A_PICTURE, False),
    ("/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]}]}, False),
])
async def test_images_for_a_model_that_cannot_see(velo, path, body, strict):
    """OpenAI's 400; in the other dialects the image becomes a note, so a picture in the history (Claude Code
    reading an image file, a photo in an Open WebUI or Continue chat, sent again each turn) does not fail every
    later turn of the session. Ollama checks no vision either."""
    c, backend = await velo(capabilities=("completion", "tools"))
    resp = await c.post(path, json={"model": "tiny", **body})
    if strict:
        assert resp.status == 400 and "does not support vision" in await resp.text()
        return
    assert resp.status == 200, await resp.text()
    last = backend.requests[0].messages[-1]
    assert last.images == [] and last.content.endswith("[1 image left out: this model cannot see images]")
    assert last.content.startswith("cat.png" if path == "/v1/messages" else "what is this")


async def test_a_tool_results_image_reaches_a_model_that_sees(velo):
    c, backend = await velo()
    resp = await c.post("/v1/messages", json={"model": "tiny", **READ_A_PICTURE})
    result = backend.requests[0].messages[-1]
    assert resp.status == 200 and (result.role, result.content, result.images) == ("tool", "cat.png", [PNG])


async def test_a_num_ctx_under_4_is_read_as_ollama_loads_it(velo):
    """Ollama loads a model with a window of at least 4 (server/sched.go). A prompt that filled a num_ctx of 3 was
    "trimmed" by nothing ("3 -> 3 tokens") and sent with no room for its answer; -1 was "a window of -1 tokens"."""
    c, backend = await velo()

    async def ask(num_ctx: int, text: str):
        return await c.post("/api/chat", json={"model": "tiny", "stream": False, "options": {"num_ctx": num_ctx},
                                               "messages": [{"role": "user", "content": text}]})
    full = await ask(3, "one two")  # 3 tokens by the scripted count
    assert full.status == 200 and "X-Velo-Context-Trimmed" not in full.headers
    negative = await ask(-1, "one two three four five")
    assert negative.status == 200, await negative.text()
    assert negative.headers["X-Velo-Context-Trimmed"].endswith("(6 -> 3 tokens)")


@pytest.mark.parametrize("prompt", [words(60), list(range(100, 160))], ids=["text", "token ids"])
async def test_a_completions_prompt_asking_truncate_keeps_its_end(velo, prompt):
    """`truncate: true` on /v1/completions trims the prompt's start as on a chat; a prompt of token ids was a 400."""
    c, backend = await velo()
    resp = await c.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 5,
                                                 "truncate": True})
    assert resp.status == 200, await resp.text()
    sent = backend.requests[0]
    if isinstance(prompt, list):
        assert prompt[-len(sent.prompt_ids):] == sent.prompt_ids and len(sent.prompt_ids) <= LIMIT - 5
        assert resp.headers["X-Velo-Context-Trimmed"] == f"{60 - len(sent.prompt_ids)} token ids (60 -> " \
                                                         f"{len(sent.prompt_ids)} tokens)"
    else:
        assert prompt.endswith(sent.prompt) and await backend.count_tokens(sent) <= LIMIT - 5


async def test_a_chat_with_an_image_is_counted_not_guessed_under_the_window(velo):
    """A short question with a picture was "surely under" the window by its text alone and went to the backend
    unfitted; a backend whose count reads the image (here 60 tokens) is asked."""
    c, backend = await velo()
    by_words = backend.count_tokens

    async def with_images(req):
        return await by_words(req) + 60 * sum(len(m.images) for m in req.messages)
    backend.count_tokens = with_images
    await _a_picture_is_too_long(c, backend)


async def _a_picture_is_too_long(c, backend) -> None:
    """A short question with a picture, for the 50-token window: OpenAI's 400, and the backend never asked."""
    picture = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this"}, picture]}]
    resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "context_length_exceeded"
    assert backend.requests == []


async def test_a_chat_with_an_image_for_a_server_that_cannot_count_is_estimated_with_it(velo):
    """A server without a count (SGLang, LM Studio) gets the estimate, which read the text alone: a question with a
    picture was 3 tokens and went to a 50-token window unfitted. An image is Ollama's 768 tokens (adapters/base.py)."""
    c, backend = await velo()

    async def cannot(req):
        return None
    backend.count_tokens = cannot
    await _a_picture_is_too_long(c, backend)
