"""Coalescing and embedding micro-batching end to end: real HTTP clients in both dialects, backend calls counted."""
from __future__ import annotations

import asyncio
import math

import orjson
from aiohttp.test_utils import TestClient, TestServer

from adapters.protocol import ToolCall
from proxy.app import make_app
from proxy.batching.config import BatchingConfig
from proxy.cache.config import CacheConfig
from proxy.config import Config, ModelConfig
from tests.scripted import SAME_IN_EVERY_DIALECT, Script, ScriptedBackend

MESSAGES = [{"role": "user", "content": "same question"}]


def app_over(backend: ScriptedBackend, **batching: object) -> TestClient:
    config = Config(cache=CacheConfig(enabled=False), batching=BatchingConfig(**batching),  # type: ignore[arg-type]
                    models={"tiny": ModelConfig(SAME_IN_EVERY_DIALECT)})
    return TestClient(TestServer(make_app(config, {backend.name: backend}), handler_cancellation=True))


async def ollama_text(c: TestClient, options: dict) -> str:
    resp = await c.post("/api/chat", json={"model": "tiny", "messages": MESSAGES, "options": options})
    assert resp.status == 200
    return "".join(orjson.loads(line)["message"]["content"] for line in (await resp.read()).splitlines())


async def openai_text(c: TestClient, options: dict) -> str:
    resp = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True,
                                                      **options})
    assert resp.status == 200
    text = ""
    for line in (await resp.read()).decode().splitlines():
        if line.startswith("data: {"):
            delta = orjson.loads(line[6:])["choices"][0]["delta"]
            text += delta.get("content") or ""
    return text


async def test_identical_greedy_requests_in_both_dialects_share_one_backend_call():
    """Greedy in both, and the model's config sets what the dialects' defaults would set differently."""
    backend = ScriptedBackend(script=Script(pieces=["one ", "two ", "three"], delay=0.1))
    async with app_over(backend) as c:
        texts = await asyncio.gather(*[ollama_text(c, {"temperature": 0}) for _ in range(3)],
                                     *[openai_text(c, {"temperature": 0}) for _ in range(3)])
        assert texts == ["one two three"] * 6
        assert len(backend.requests) == 1 and backend.completed == 1


async def test_requests_sharing_a_call_each_get_tool_call_ids_of_their_own():
    """Every follower was handed the leader's ids (the backend's): two agents then held one call's id, and a framework
    keying on ids across sessions mixed their results up. The response's own ids were already each its own."""
    backend = ScriptedBackend(script=Script(pieces=["a"], delay=0.1, finish_reason="tool_calls",
                                            tool_calls=[ToolCall("lookup", {"q": "x"}, "call_backend")]))
    tool = {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
    asked = {"model": "tiny", "messages": MESSAGES, "stream": False}
    greedy = {"temperature": 0, "max_tokens": 64}
    bodies = {"/api/chat": {**asked, "options": {"temperature": 0, "num_predict": 64},
                            "tools": [{"type": "function", "function": tool}]},
              "/v1/chat/completions": {**asked, **greedy, "tools": [{"type": "function", "function": tool}]},
              "/v1/messages": {**asked, **greedy, "tools": [{"name": "lookup", "input_schema": tool["parameters"]}]},
              "/v1/responses": {"model": "tiny", "input": MESSAGES, "temperature": 0, "max_output_tokens": 64,
                                "tools": [{"type": "function", **tool}]}}
    async with app_over(backend) as c:
        answers = await asyncio.gather(*[c.post(path, json=body) for path, body in bodies.items() for _ in (1, 2)])
        got = [await a.json() for a in answers]
    assert len(backend.requests) == 1
    ollama, openai, anthropic, responses = (got[i:i + 2] for i in range(0, 8, 2))
    ids = [a["message"]["tool_calls"][0]["id"] for a in ollama] + \
        [a["choices"][0]["message"]["tool_calls"][0]["id"] for a in openai] + \
        [a["content"][1]["id"] for a in anthropic] + [a["output"][1]["call_id"] for a in responses]
    assert len(set(ids)) == 8 and all(i.startswith("call_") for i in ids)
    assert len({a["id"] for a in openai + anthropic + responses}) == 6
    assert len({i["id"] for a in responses for i in a["output"]}) == 4


async def test_one_name_answered_by_two_backends_is_two_calls_and_two_names_of_one_model_one():
    """The key named the model as the client wrote it: a listing refresh that moved `tiny` to another backend while
    a call to the first was in flight gave the next request for `tiny` the first backend's answer. Two aliases of
    one backend model ask that model the same, so they share a call (nothing below the key reads the name asked)."""
    from proxy.state import GENERATIONS
    first = ScriptedBackend("first", script=Script(pieces=["from ", "first"], delay=0.1))
    second = ScriptedBackend("second", models=("other:latest",), script=Script(pieces=["from ", "second"], delay=0.1))
    config = Config(cache=CacheConfig(enabled=False), aliases={"fast": "second:tiny:latest", "quick": "tiny:latest"})
    async with TestClient(TestServer(make_app(config, {"first": first, "second": second}))) as c:
        body = {"model": "tiny", "messages": MESSAGES, "stream": False, "options": {"temperature": 0}}
        leader = asyncio.create_task(c.post("/api/chat", json=body))
        await asyncio.sleep(0.05)
        first.models, second.models = ["other:latest"], ["tiny:latest"]
        await c.server.app[GENERATIONS].current.router.listings.refresh()
        moved = await (await c.post("/api/chat", json=body)).json()
        assert (await (await leader).json())["message"]["content"] == "from first"
        assert moved["message"]["content"] == "from second"
        aliases = await asyncio.gather(*[c.post("/api/chat", json={**body, "model": m}) for m in ("fast", "quick")])
        assert [(await a.json())["model"] for a in aliases] == ["fast", "quick"]
    assert len(first.requests) == 1 and [r.model for r in second.requests] == ["tiny:latest"] * 2


async def test_requests_keeping_the_model_loaded_for_different_times_each_get_their_own_call():
    """Only the leader's call reaches the backend, with the leader's `keep_alive`."""
    backend = ScriptedBackend(script=Script(delay=0.1))
    body = {"model": "tiny", "messages": MESSAGES, "stream": False, "options": {"temperature": 0}}
    async with app_over(backend) as c:
        answers = await asyncio.gather(*[c.post("/api/chat", json={**body, "keep_alive": k}) for k in ("1h", "5m")],
                                       c.post("/api/chat", json={**body, "keep_alive": "1h"}))
        assert [a.status for a in answers] == [200, 200, 200]
    assert sorted(r.keep_alive for r in backend.requests) == ["1h", "5m"]


async def test_requests_with_different_performance_options_each_get_their_own_call():
    """`num_gpu` and the like change no answer (the cache's key leaves them out) but go with the call."""
    backend = ScriptedBackend(script=Script(delay=0.1))
    body = {"model": "tiny", "messages": MESSAGES, "stream": False}
    async with app_over(backend) as c:
        answers = await asyncio.gather(*[c.post("/api/chat", json={**body, "options": {"temperature": 0, **o}})
                                         for o in ({"num_gpu": 0}, {"num_gpu": 99}, {"num_gpu": 0})])
        assert [a.status for a in answers] == [200, 200, 200]
    assert sorted(r.options.extra["num_gpu"] for r in backend.requests) == [0, 99]


async def test_sampled_requests_and_disabled_coalescing_each_get_their_own_call():
    backend = ScriptedBackend(script=Script(delay=0.05))
    async with app_over(backend) as c:
        await asyncio.gather(*[ollama_text(c, {"temperature": 0.8}) for _ in range(3)])
        assert len(backend.requests) == 3
    backend = ScriptedBackend(script=Script(delay=0.05))
    async with app_over(backend, coalesce=False) as c:
        await asyncio.gather(*[openai_text(c, {"seed": 7}) for _ in range(3)])
        assert len(backend.requests) == 3


async def test_greedy_prompts_of_token_ids_share_a_call_only_when_their_ids_are_the_same():
    """Their text prompt is "" in every one: the ids are what tells them apart."""
    backend = ScriptedBackend(script=Script(delay=0.1))
    async with app_over(backend) as c:
        answers = await asyncio.gather(*[c.post("/v1/completions", json={"model": "tiny", "prompt": ids,
                                                                         "temperature": 0})
                                         for ids in ([1, 2, 3], [1, 2, 4], [1, 2, 3])])
        assert [a.status for a in answers] == [200, 200, 200]
    assert sorted(r.prompt_ids for r in backend.requests) == [[1, 2, 3], [1, 2, 4]]


async def test_one_coalesced_client_leaving_does_not_cancel_the_others():
    backend = ScriptedBackend(script=Script(pieces=["x"] * 10, delay=0.03))
    async with app_over(backend) as c:
        body = {"model": "tiny", "messages": MESSAGES, "options": {"temperature": 0}}
        leaver = await c.post("/api/chat", json=body)
        await leaver.content.readline()
        stayer = asyncio.create_task(ollama_text(c, {"temperature": 0}))
        await asyncio.sleep(0.05)
        leaver.close()
        assert await stayer == "x" * 10
        assert len(backend.requests) == 1 and backend.cancelled == 0


async def test_concurrent_embeds_in_both_dialects_become_one_backend_call():
    backend = ScriptedBackend()
    async with app_over(backend, embed_window_ms=100) as c:
        async def ollama(inputs: list[str]) -> list[list[float]]:
            resp = await c.post("/api/embed", json={"model": "tiny", "input": inputs})
            return (await resp.json())["embeddings"]

        async def openai(text: str) -> list[list[float]]:
            resp = await c.post("/v1/embeddings", json={"model": "tiny", "input": text})
            return [d["embedding"] for d in (await resp.json())["data"]]

        results = await asyncio.gather(ollama(["a", "bb"]), openai("ccc"), ollama(["dddd"]), openai("eeeee"))
        assert [[e[0] for e in r] for r in results] == [[1.0, 2.0], [3.0], [4.0], [5.0]]  # each its own inputs
        assert len(backend.requests) == 1 and sorted(backend.requests[0].inputs) == ["a", "bb", "ccc", "dddd",
                                                                                     "eeeee"]


async def test_a_vector_not_all_finite_fails_only_its_own_caller_of_a_batch():
    """The engine's NaN went out as nulls; now it is the backend's 502, not to be retried (the same input embeds the
    same), and the callers it shared a batch with get their vectors."""
    class NaNs(ScriptedBackend):
        async def embed(self, req):
            result = await super().embed(req)
            result.embeddings = [[math.nan] * 3 if t == "nan" else v for t, v in zip(req.inputs, result.embeddings)]
            return result

    backend = NaNs()
    async with app_over(backend, embed_window_ms=100) as c:
        ok, bad, also = await asyncio.gather(c.post("/api/embed", json={"model": "tiny", "input": ["a", "bb"]}),
                                             c.post("/v1/embeddings", json={"model": "tiny", "input": "nan"}),
                                             c.post("/v1/embeddings", json={"model": "tiny", "input": "ccc"}))
        assert len(backend.requests) == 1 and (ok.status, bad.status, also.status) == (200, 502, 200)
        assert (await ok.json())["embeddings"] == [[1.0, 1.0, 0.0], [2.0, 1.0, 0.0]]
        error = (await bad.json())["error"]
        assert "not a finite number" in error["message"] and bad.headers["x-should-retry"] == "false"


async def test_embeddings_take_the_backends_slots_as_generations_do():
    """Embedding calls went around the backend's queue: 100 requests that could not be merged (each its own
    `dimensions`) were 100 calls at once to a backend of 4 slots."""
    class Slow(ScriptedBackend):
        active = peak = 0

        async def embed(self, req):
            self.active += 1
            self.peak = max(self.peak, self.active)
            await asyncio.sleep(0.02)
            self.active -= 1
            return await super().embed(req)

    backend = Slow()
    backend.config.max_concurrency = 3
    async with app_over(backend) as c:
        answers = await asyncio.gather(*[c.post("/v1/embeddings", json={"model": "tiny", "input": "a", "dimensions":
                                                                         d}) for d in range(1, 13)])
        assert [r.status for r in answers] == [200] * 12 and backend.peak == 3


async def test_a_caller_that_leaves_while_its_batch_waits_for_a_slot_is_not_sent():
    """A batch took its inputs before it waited for the backend's slot: an embedding whose client had left while it
    queued was still sent, where a queued generation is never sent once its client left."""
    backend = ScriptedBackend(script=Script(pieces=["x"] * 10, delay=0.03))
    backend.config.max_concurrency = 1
    async with app_over(backend, embed_window_ms=20) as c:
        running = asyncio.create_task(c.post("/api/chat", json={"model": "tiny", "messages": MESSAGES}))
        await asyncio.sleep(0.05)
        leaver, stayer = (asyncio.create_task(c.post("/v1/embeddings", json={"model": "tiny", "input": text}))
                          for text in ("gone", "here"))
        await asyncio.sleep(0.1)  # the batch is made and waits for the slot the chat holds
        leaver.cancel()
        assert (await stayer).status == 200 and (await running).status == 200
    assert [r.inputs for r in backend.requests if not hasattr(r, "messages")] == [["here"]]


async def test_embed_batches_are_capped_at_max_inputs():
    backend = ScriptedBackend()
    async with app_over(backend, embed_window_ms=100, embed_max_inputs=4) as c:
        await asyncio.gather(*[c.post("/api/embed", json={"model": "tiny", "input": [str(i)] * 2})
                               for i in range(4)])
        assert [len(r.inputs) for r in backend.requests] == [4, 4]


class Counting(ScriptedBackend):
    """Reports `slots` as its concurrency (or fails to, like a server down at startup); tracks peak streams."""

    def __init__(self, slots: int | None, **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.slots, self.active, self.peak = slots, 0, 0

    async def concurrency(self) -> int:
        if self.slots is None:
            raise ConnectionError("backend down")
        return self.slots

    async def _run(self):  # type: ignore[override]
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            async for chunk in super()._run():
                yield chunk
        finally:
            self.active -= 1


async def test_admission_holds_requests_to_the_slots_the_backend_reports():
    backend = Counting(2, name="named-differently", script=Script(delay=0.03))
    app = make_app(Config(cache=CacheConfig(enabled=False)), {"key": backend})
    async with TestClient(TestServer(app)) as c:
        await asyncio.gather(*[ollama_text(c, {"temperature": 0.5}) for _ in range(6)])
    assert backend.peak == 2 and len(backend.requests) == 6


async def test_a_backend_down_at_startup_gets_the_configured_limit():
    backend = Counting(None, script=Script(delay=0.03))
    backend.config.max_concurrency = 3
    async with app_over(backend) as c:
        await asyncio.gather(*[ollama_text(c, {"temperature": 0.5}) for _ in range(6)])
    assert backend.peak == 3


async def test_a_backend_down_at_startup_gets_its_own_slots_once_it_says(monkeypatch):
    """A llama-server started after Velo kept the assumed 4 slots until Velo restarted."""
    from proxy.stages import admit
    monkeypatch.setattr(admit, "_SLOTS_AGAIN_S", 0.05)
    backend = Counting(None, script=Script(delay=0.05))
    async with app_over(backend) as c:
        await asyncio.gather(*[ollama_text(c, {"temperature": 0.5}) for _ in range(8)])
        assert backend.peak == 4
        backend.slots, backend.peak = 6, 0
        await asyncio.sleep(0.2)
        await asyncio.gather(*[ollama_text(c, {"temperature": 0.5}) for _ in range(12)])
        scraped = await (await c.get("/metrics")).text()
        assert backend.peak == 6 and 'velo_backend_slots{backend="scripted"} 6.0' in scraped


async def test_a_queue_kept_through_a_reload_asks_the_new_backend_for_its_slots(monkeypatch):
    """A reload that keeps the queue but makes a new backend object (a timeout changed) while the server is down:
    the queue went on asking the old object, closed with the old configuration, and kept 4 slots for good."""
    import tempfile

    from proxy.config import Config
    from proxy.generation import Generation, Generations
    from proxy.keep import Keep
    from proxy.stages import admit
    monkeypatch.setattr(admit, "_SLOTS_AGAIN_S", 0.05)

    class Server(ScriptedBackend):
        up, closed = False, False

        async def concurrency(self) -> int:
            if self.closed or not Server.up:
                raise ConnectionError("down" if not self.closed else "closed")
            return 8

        async def close(self) -> None:
            self.closed = True
    config = Config()
    config.presets.path = tempfile.mktemp()
    keep, old, new = Keep(), Server("s"), Server("s")
    new.config.total_timeout = old.config.total_timeout + 1
    first = Generation.build(1, config, keep, {"s": old})
    await first.start()
    generations = Generations(first)
    second = Generation.build(2, config, keep, {"s": new})
    await second.start()
    generations.swap(second)
    await asyncio.gather(*generations.retiring)
    controller = second.pipeline.stage(admit.Admit).controllers["s"]
    assert controller is first.pipeline.stage(admit.Admit).controllers["s"] and old.closed
    Server.up = True
    for _ in range(50):
        if controller.limit == 8:
            break
        await asyncio.sleep(0.02)
    assert controller.limit == 8
    await generations.close()


async def test_clients_with_different_api_keys_take_turns_in_the_queue():
    backend = ScriptedBackend(script=Script(delay=0.1))
    backend.config.max_concurrency = 1
    async with app_over(backend) as c:
        async def ask(key: str, text: str) -> None:
            body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "stream": False}
            resp = await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert resp.status == 200

        tasks = [asyncio.create_task(ask("busy", "busy"))]
        await asyncio.sleep(0.02)
        for text in ["a1", "a2", "a3"]:
            tasks.append(asyncio.create_task(ask("key-a", text)))
            await asyncio.sleep(0.03)
        tasks.append(asyncio.create_task(ask("key-b", "b1")))
        await asyncio.gather(*tasks)
    order = [r.messages[-1].content for r in backend.requests]
    assert order == ["busy", "a1", "b1", "a2", "a3"]


async def test_embeddings_of_different_api_keys_take_turns_in_the_queue():
    """Every embedding call queued in one line ("embeddings"): one key's single embedding waited behind every call
    another key's indexing had queued ([['a0'], ['a1'], ['a2'], ['a3'], ['a4'], ['a5'], ['b']])."""
    class Slow(ScriptedBackend):
        async def embed(self, req):  # noqa: ANN001, ANN202
            await asyncio.sleep(0.03)
            return await super().embed(req)

    backend = Slow()
    backend.config.max_concurrency = 1
    async with app_over(backend, embed_window_ms=0) as c:
        async def ask(key: str, text: str, dimensions: int) -> None:
            body = {"model": "tiny", "input": text, "dimensions": dimensions}  # each its own: none merge
            resp = await c.post("/v1/embeddings", json=body, headers={"Authorization": f"Bearer {key}"})
            assert resp.status == 200

        tasks = [asyncio.create_task(ask("key-a", f"a{i}", i + 1)) for i in range(6)]
        await asyncio.sleep(0.015)
        tasks.append(asyncio.create_task(ask("key-b", "b", 99)))
        await asyncio.gather(*tasks)
    order = [r.inputs[0] for r in backend.requests]
    assert order.index("b") == 2 and sorted(order) == ["a0", "a1", "a2", "a3", "a4", "a5", "b"]  # one running, one
    # waiting before it: key-b's turn comes after key-a's next, as a generation's does


class Stuck(ScriptedBackend):
    """Holds every stream until `go` is set: a backend whose slots do not free."""

    def __init__(self) -> None:
        super().__init__()
        self.running, self.go = asyncio.Event(), asyncio.Event()

    async def _run(self, logprobs: bool = False):  # type: ignore[override]
        self.running.set()
        await self.go.wait()
        async for chunk in super()._run(logprobs):
            yield chunk


async def test_a_request_queued_past_queue_timeout_s_gets_429_in_its_dialect():
    """Behind a slot that did not free, a queued request waited as long as the slot was held (its backend's timeouts
    start only once it runs); now each dialect's client gets a full queue's 429 with Retry-After, which the SDKs
    retry, in its own error shape."""
    backend = Stuck()
    backend.config.max_concurrency = 1
    async with app_over(backend, queue_timeout_s=0.05) as c:
        held = asyncio.create_task(ollama_text(c, {}))
        await backend.running.wait()
        chat = {"model": "tiny", "messages": MESSAGES}
        asked = [c.post(path, json=body) for path, body in [
            ("/api/chat", chat), ("/v1/chat/completions", chat), ("/v1/messages", {**chat, "max_tokens": 16})]]
        ollama, openai, anthropic = await asyncio.wait_for(asyncio.gather(*asked), 10)  # the bound only on failure
        assert [r.status for r in (ollama, openai, anthropic)] == [429] * 3
        assert all(int(r.headers["Retry-After"]) >= 1 for r in (ollama, openai, anthropic))
        assert "queue_timeout_s" in (await ollama.json())["error"]
        assert (await openai.json())["error"]["type"] == "rate_limit_error"
        assert (await anthropic.json())["error"]["type"] == "rate_limit_error"
        backend.go.set()
        assert await held == "Hello world"
    assert len(backend.requests) == 1


async def test_fill_in_the_middle_jumps_the_queue_in_both_dialects():
    backend = ScriptedBackend(script=Script(delay=0.1))
    backend.config.max_concurrency = 1
    async with app_over(backend) as c:
        def chat(text: str) -> dict:
            return {"model": "tiny", "messages": [{"role": "user", "content": text}], "stream": False}
        requests = [("/api/chat", chat("busy")), ("/api/chat", chat("chat1")), ("/v1/chat/completions", chat("chat2")),
                    ("/v1/completions", {"model": "tiny", "prompt": "fim-openai", "suffix": "}"}),
                    ("/api/generate", {"model": "tiny", "prompt": "fim-ollama", "suffix": "}", "stream": False})]
        tasks = []
        for path, body in requests:
            client = {"X-Velo-Client": body.get("prompt", "")}
            tasks.append(asyncio.create_task(c.post(path, json=body, headers=client)))
            await asyncio.sleep(0.03)
        assert [r.status for r in await asyncio.gather(*tasks)] == [200] * 5
    order = [getattr(r, "prompt", None) or r.messages[-1].content for r in backend.requests]
    assert order == ["busy", "fim-openai", "fim-ollama", "chat1", "chat2"]


async def test_replacing_an_autocomplete_never_fails_another_clients_identical_one():
    backend = ScriptedBackend(script=Script(pieces=["x"] * 10, delay=0.02))
    async with app_over(backend) as c:
        body = {"model": "tiny", "prompt": "def f(", "suffix": ")", "options": {"temperature": 0}}
        first = await c.post("/api/generate", json=body, headers={"X-Velo-Client": "ide-1"})
        await first.content.readline()
        other = asyncio.create_task(c.post("/api/generate", json=body, headers={"X-Velo-Client": "ide-2"}))
        await asyncio.sleep(0.05)
        newer = await c.post("/api/generate", json={**body, "prompt": "def fo("}, headers={"X-Velo-Client": "ide-1"})
        await newer.read()
        other_lines = (await (await other).read()).splitlines()
        assert b"error" in (await first.read()).splitlines()[-1]
        assert orjson.loads(other_lines[-1])["done"] is True and b"error" not in b"".join(other_lines)


async def test_a_stream_never_joins_a_one_answer_request_in_flight():
    """The one-answer leader's backend stream is folded into one chunk in the adapter: a streamed request that
    joined it got every token at once, at the end (a real adapter here: the scripted one does not fold)."""
    from adapters.base import BackendConfig
    from tests.fakes import FakeOpenAI
    async with FakeOpenAI(models=["fake"]) as fake:
        fake.script.reply, fake.script.token_delay = "one two three four five six", 0.05
        config = Config(cache=CacheConfig(enabled=False),
                        backends=[BackendConfig(name="up", kind="openai", urls=[fake.url])])
        async with TestClient(TestServer(make_app(config))) as c:
            body = {"model": "fake", "messages": MESSAGES, "temperature": 0}
            whole = asyncio.create_task(c.post("/v1/chat/completions", json=body))
            await asyncio.sleep(0.1)
            resp = await c.post("/v1/chat/completions", json={**body, "stream": True})
            deltas = [line for line in (await resp.read()).split(b"\n\n") if b'"content":"' in line
                      and b'"content":""' not in line]
            assert (await whole).status == 200
    assert len(deltas) > 1  # its own stream, token by token
