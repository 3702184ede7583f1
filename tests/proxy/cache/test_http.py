"""Every cache policy through the real app and both dialects, over a scripted backend that counts its calls."""
from __future__ import annotations

import asyncio
import uuid

import orjson

from adapters.protocol import ToolCall
from proxy.cache import CacheConfig, RoutePolicy
from proxy.state import GENERATIONS
from proxy.stages.cache import Cache
from proxy.config import ModelConfig
from tests.scripted import SAME_IN_EVERY_DIALECT, Script, ScriptedBackend

MESSAGES = [{"role": "user", "content": "hi"}]
SHARED = {"tiny": ModelConfig(SAME_IN_EVERY_DIALECT)}  # the dialects' defaults differ; this makes them agree


def _openai(stream: bool = True, **extra) -> dict:
    return {"model": "tiny", "messages": MESSAGES, "temperature": 0, "stream": stream, **extra}


def _ollama(stream: bool = True, **options) -> dict:
    return {"model": "tiny", "messages": MESSAGES, "stream": stream, "options": {"temperature": 0, **options}}


def _sse_events(raw: bytes) -> list:
    return [orjson.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")]


async def test_dialects_share_entries_and_replay_as_ndjson_stream(velo):
    backend = ScriptedBackend()
    client = await velo(CacheConfig(), backend, models=SHARED)
    first = await client.post("/v1/chat/completions", json=_openai(stream=False))
    assert first.headers["X-Velo-Cache"] == "miss"
    assert (await first.json())["choices"][0]["message"]["content"] == "Hello world"
    replay = await client.post("/api/chat", json=_ollama())
    assert replay.headers["X-Velo-Cache"] == "exact" and replay.content_type == "application/x-ndjson"
    lines = [orjson.loads(line) for line in (await replay.read()).splitlines()]
    assert [line["message"]["content"] for line in lines] == ["Hel", "lo", " world", ""]
    assert [line["done"] for line in lines] == [False, False, False, True] and lines[-1]["eval_count"] == 3
    assert len(backend.requests) == 1


async def test_replay_as_sse_stream(velo):
    backend = ScriptedBackend()
    client = await velo(CacheConfig(), backend, models=SHARED)
    await (await client.post("/api/chat", json=_ollama(stream=False))).read()
    replay = await client.post("/v1/chat/completions", json=_openai())
    assert replay.headers["X-Velo-Cache"] == "exact" and replay.content_type == "text/event-stream"
    raw = await replay.read()
    events = _sse_events(raw)
    deltas = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
    assert [d for d in deltas if d] == ["Hel", "lo", " world"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop" and raw.endswith(b"data: [DONE]\n\n")
    assert len(backend.requests) == 1


async def test_a_replayed_call_gets_ids_of_its_own(velo):
    """Two answers from one cache entry carried the same call id, where a fresh answer's is new (an agent pairs
    results with calls by id)."""
    backend = ScriptedBackend(script=Script(tool_calls=[ToolCall("read_file", {"path": "a.py"}, id="call_1")]))
    client = await velo(CacheConfig(), backend, models=SHARED)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}}}}]
    answers = []
    for _ in range(3):
        resp = await client.post("/v1/chat/completions", json=_openai(stream=False, tools=tools))
        answers.append(((await resp.json())["choices"][0]["message"]["tool_calls"][0], resp.headers["X-Velo-Cache"]))
    assert [cache for _, cache in answers] == ["miss", "exact", "exact"] and len(backend.requests) == 1
    assert len({call["id"] for call, _ in answers}) == 3
    assert {call["function"]["arguments"] for call, _ in answers} == {'{"path":"a.py"}'}


async def test_completions_are_cached_across_dialects_too(velo):
    """OpenAI completions are raw prompts; so is an Ollama generate with `raw`, and only then do they agree."""
    backend = ScriptedBackend()
    client = await velo(CacheConfig(), backend, models=SHARED)
    await (await client.post("/api/generate", json={"model": "tiny", "prompt": "2+2=", "stream": False,
                                                    "raw": True, "options": {"seed": 7}})).read()
    again = await client.post("/v1/completions", json={"model": "tiny", "prompt": "2+2=", "seed": 7})
    assert again.headers["X-Velo-Cache"] == "exact" and len(backend.requests) == 1


async def test_prompts_of_token_ids_one_id_apart_are_two_entries(velo):
    """Their text prompt is "" in each, as in a prompt of "": the ids are the key's, and a text prompt never shares
    an entry with ids."""
    backend = ScriptedBackend()
    client = await velo(CacheConfig(), backend)
    seen = [(await client.post("/v1/completions", json={"model": "tiny", "prompt": ids, "seed": 7})).headers[
        "X-Velo-Cache"] for ids in ([1, 2, 3], [1, 2, 4], [1, 2, 3], "")]
    assert seen == ["miss", "miss", "exact", "miss"]
    assert [r.prompt_ids for r in backend.requests] == [[1, 2, 3], [1, 2, 4], None]


async def test_the_key_sees_each_dialects_defaults(velo):
    """Greedy in both dialects, but Ollama's defaults add repeat_penalty 1.1 (and more) that OpenAI's do not: two
    different requests, two entries; each hits its own."""
    backend = ScriptedBackend()
    client = await velo(CacheConfig(), backend)
    assert (await client.post("/api/chat", json=_ollama(stream=False))).headers["X-Velo-Cache"] == "miss"
    assert (await client.post("/v1/chat/completions", json=_openai(stream=False))).headers["X-Velo-Cache"] == "miss"
    assert [r.options.repeat_penalty for r in backend.requests] == [1.1, None]
    for again in (_ollama(stream=False), _openai(stream=False)):
        path = "/api/chat" if "options" in again else "/v1/chat/completions"
        assert (await client.post(path, json=again)).headers["X-Velo-Cache"] == "exact"
    assert len(backend.requests) == 2


async def test_sampled_requests_are_not_cached(velo):
    backend = ScriptedBackend()
    client = await velo(CacheConfig(), backend)
    for body in ({"model": "tiny", "messages": MESSAGES, "temperature": 0.7, "stream": False},
                 {"model": "tiny", "messages": MESSAGES}):  # no temperature: the backend samples
        for _ in range(2):
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.headers["X-Velo-Cache"] == "skip" and "temperature 0 or a seed" in \
                resp.headers["X-Velo-Cache-Reason"]
    assert len(backend.requests) == 4


async def test_a_replay_reports_its_own_timings_and_the_original_counts(velo):
    backend = ScriptedBackend(script=Script(eval_ns=9_900_000_000, delay=0.1))  # it says it decoded for 9.9 s
    client = await velo(CacheConfig(), backend)
    first = await (await client.post("/api/chat", json=_ollama(stream=False))).json()
    replay = await client.post("/api/chat", json=_ollama(stream=False))
    again = await replay.json()
    assert replay.headers["X-Velo-Cache"] == "exact" and "X-Velo-Cache-Reason" not in replay.headers
    assert (again["eval_count"], again["prompt_eval_count"]) == (first["eval_count"], first["prompt_eval_count"])
    assert first["eval_duration"] == 9_900_000_000 and again["eval_duration"] < 100_000_000
    assert again["total_duration"] < 100_000_000 < 300_000_000 <= first["total_duration"]  # 3 pieces 0.1 s apart
    assert "load_duration" not in again  # none: Ollama leaves a 0 out (api/types.go Metrics, omitempty)
    assert again["eval_duration"] + again["prompt_eval_duration"] <= again["total_duration"]


async def test_policy_per_route(velo):
    backend = ScriptedBackend(models=("tiny:latest", "sampler:latest"))
    client = await velo(CacheConfig(routes=[RoutePolicy("tiny*", enabled=False),
                                            RoutePolicy("sampler", cache_nondeterministic=True)]), backend)
    sampled = {"model": "sampler", "messages": MESSAGES, "stream": False, "temperature": 0.7}
    statuses = [(await client.post("/api/chat", json=_ollama(stream=False))).headers["X-Velo-Cache"],
                (await client.post("/api/chat", json=_ollama(stream=False))).headers["X-Velo-Cache"],
                (await client.post("/v1/chat/completions", json=sampled)).headers["X-Velo-Cache"],
                (await client.post("/v1/chat/completions", json=sampled)).headers["X-Velo-Cache"]]
    assert statuses == ["skip", "skip", "miss", "exact"] and len(backend.requests) == 3


async def test_an_answer_the_context_window_cut_is_not_replayed(velo):
    """3 tokens for a max_tokens of 500 (Anthropic's model_context_window_exceeded): the server's window ended it,
    and once that grows the backend answers whole, where the cut answer was replayed. Cut at the request's own
    max_tokens, it is replayed."""
    backend = ScriptedBackend(script=Script(finish_reason="length"))
    client = await velo(CacheConfig(), backend)
    ask = {"model": "tiny", "max_tokens": 500, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
    for max_tokens, expected in ((500, ["miss", "miss"]), (3, ["miss", "exact"])):
        seen = []
        for _ in range(2):
            resp = await client.post("/v1/messages", json={**ask, "max_tokens": max_tokens})
            await resp.read()
            seen.append(resp.headers["X-Velo-Cache"])
        assert seen == expected, max_tokens


class _Sampler(ScriptedBackend):
    """Another sample for every call, as a sampled model writes."""

    def chat(self, req):
        self.script = Script(pieces=[f"sample {len(self.requests)}"])
        return super().chat(req)


async def test_the_choices_of_a_sampled_request_are_samples_of_their_own(velo):
    """`n: 2` with cache_nondeterministic: each choice was the first's sample, cached or not (n copies of one); a
    replay gives back the two samples."""
    backend = _Sampler()
    client = await velo(CacheConfig(cache_nondeterministic=True), backend)
    body = {"model": "tiny", "messages": MESSAGES, "stream": False, "temperature": 0.7, "n": 2}
    answers = []
    for _ in range(2):
        resp = await client.post("/v1/chat/completions", json=body)
        answers.append([c["message"]["content"] for c in (await resp.json())["choices"]])
    assert answers[0] == answers[1] and len(set(answers[0])) == 2 and len(backend.requests) == 2
    greedy = {**body, "temperature": 0}  # the same answer each time: the choices share one entry
    for _ in range(2):
        await (await client.post("/v1/chat/completions", json=greedy)).read()
    assert len(backend.requests) == 3


async def test_bypass_headers_and_fields(velo):
    backend = ScriptedBackend()
    client = await velo(CacheConfig(), backend)
    await (await client.post("/api/chat", json=_ollama(stream=False))).read()
    bypasses = [("/api/chat", _ollama(stream=False), {"Cache-Control": "no-cache"}),
                ("/api/chat", _ollama(stream=False), {"X-Velo-Cache": "off"}),
                ("/api/chat", _ollama(stream=False, cache=False), {}),
                ("/v1/chat/completions", _openai(stream=False, cache=False), {}),
                ("/v1/chat/completions", _openai(stream=False), {"Cache-Control": "no-store"})]
    for path, body, headers in bypasses:
        resp = await client.post(path, json=body, headers=headers)
        assert resp.status == 200 and resp.headers["X-Velo-Cache"] == "bypass", (path, body, headers)
    assert len(backend.requests) == 1 + len(bypasses)


async def test_errors_are_not_cached(velo):
    backend = ScriptedBackend(script=Script(fail_after=2))
    client = await velo(CacheConfig(), backend)
    broken = await client.post("/api/chat", json=_ollama())
    assert b"error" in await broken.read()
    backend.script = Script()
    retry = await client.post("/api/chat", json=_ollama())
    assert retry.headers["X-Velo-Cache"] == "miss" and len(backend.requests) == 2


async def test_cancelled_streams_are_not_cached(velo):
    backend = ScriptedBackend(script=Script(delay=0.2))
    client = await velo(CacheConfig(), backend)
    resp = await client.post("/v1/chat/completions", json=_openai())
    await resp.content.readline()
    resp.close()  # the client goes away mid-stream
    for _ in range(50):
        if backend.cancelled:
            break
        await asyncio.sleep(0.05)
    assert backend.cancelled == 1
    backend.script = Script()
    again = await client.post("/v1/chat/completions", json=_openai())
    assert again.headers["X-Velo-Cache"] == "miss" and len(backend.requests) == 2


async def test_a_stream_is_stored_only_once_complete(velo):
    backend = ScriptedBackend(script=Script(delay=0.1))
    client = await velo(CacheConfig(), backend)
    cache = client.app[GENERATIONS].current.pipeline.stage(Cache).layer
    resp = await client.post("/api/chat", json=_ollama())
    await resp.content.readline()
    assert cache.stats()["bytes"]["memory_entries"] == 0
    await resp.read()
    assert cache.stats()["bytes"]["memory_entries"] == 1


async def test_tenants_are_isolated_by_api_key(velo):
    backend = ScriptedBackend()
    client = await velo(CacheConfig(), backend, api_keys=["key-a", "key-b"])
    alice, bob = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}

    async def status(headers: dict) -> str:
        return (await client.post("/api/chat", json=_ollama(stream=False), headers=headers)).headers["X-Velo-Cache"]

    assert [await status(alice), await status(bob), await status(alice)] == ["miss", "miss", "exact"]
    assert len(backend.requests) == 2


async def test_entries_expire_after_the_ttl(velo):
    backend = ScriptedBackend()
    client = await velo(CacheConfig(ttl_s=0.3), backend)
    await (await client.post("/api/chat", json=_ollama(stream=False))).read()
    assert (await client.post("/api/chat", json=_ollama(stream=False))).headers["X-Velo-Cache"] == "exact"
    await asyncio.sleep(0.4)
    assert (await client.post("/api/chat", json=_ollama(stream=False))).headers["X-Velo-Cache"] == "miss"


async def test_memory_tier_is_bounded_by_bytes(velo):
    backend = ScriptedBackend()
    client = await velo(CacheConfig(max_bytes=600), backend)  # one ~400-byte answer fits, two do not
    first, second = _ollama(stream=False), _ollama(stream=False, seed=1)
    for body in (first, second, first):
        assert (await client.post("/api/chat", json=body)).headers["X-Velo-Cache"] == "miss"
    assert client.app[GENERATIONS].current.pipeline.stage(Cache).layer.stats()["bytes"]["memory"] <= 600
    assert len(backend.requests) == 3


async def test_sqlite_keeps_answers_across_a_restart(velo, tmp_path):
    cfg = CacheConfig(sqlite_path=str(tmp_path / "velo-cache.db"))
    first = await velo(cfg, models=SHARED)
    await (await first.post("/api/chat", json=_ollama(stream=False))).read()
    await first.close()
    backend = ScriptedBackend()
    restarted = await velo(cfg, backend, models=SHARED)
    resp = await restarted.post("/v1/chat/completions", json=_openai(stream=False))
    assert resp.headers["X-Velo-Cache"] == "exact" and backend.requests == []


async def test_two_velo_processes_share_one_redis(velo, redis_url):
    a_backend, b_backend = ScriptedBackend(), ScriptedBackend()
    a = await velo(CacheConfig(redis_url=redis_url), a_backend, models=SHARED)
    b = await velo(CacheConfig(redis_url=redis_url), b_backend, models=SHARED)
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"hi {uuid.uuid4()}"}], "temperature": 0}
    await (await a.post("/v1/chat/completions", json=body)).read()
    resp = await b.post("/api/chat", json={**body, "options": {"temperature": 0}})
    assert resp.headers["X-Velo-Cache"] == "exact" and b_backend.requests == []
    assert b.app[GENERATIONS].current.pipeline.stage(Cache).layer.stats()["events"]["redis"]["tiny"] == {"hit": 1}


async def test_semantic_hit_through_the_proxy(velo, shared_embedder):
    backend = ScriptedBackend()
    client = await velo(CacheConfig(semantic=True), backend)
    ask = lambda text: {"model": "tiny", "messages": [{"role": "user", "content": text}],  # noqa: E731
                        "stream": False, "temperature": 0}
    await (await client.post("/v1/chat/completions", json=ask("How do I learn Python quickly?"))).read()
    resp = await client.post("/v1/chat/completions", json=ask("How can I learn Python fast?"))
    assert resp.headers["X-Velo-Cache"] == "semantic"
    assert (await resp.json())["choices"][0]["message"]["content"] == "Hello world"
    resp = await client.post("/v1/chat/completions", json=ask("How can I learn Rust fast?"))
    assert resp.headers["X-Velo-Cache"] == "miss" and len(backend.requests) == 2
