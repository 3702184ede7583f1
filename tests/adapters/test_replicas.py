"""Replica sets: least-outstanding routing, failover before the first byte, circuit breaking, health probes,
prefix affinity, and the registry building one from several urls (against real fake upstreams)."""
from __future__ import annotations

import asyncio
import contextlib

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from adapters.errors import BackendError, BackendUnavailable, BadRequest, ModelNotFound, Overloaded
from adapters.http import Loading
from adapters.protocol import ChatRequest, Chunk, CompletionRequest, Message
from adapters.registry import make_backend
from adapters.replicas import ReplicaOptions, ReplicaSet
from proxy.app import make_app
from proxy.config import Config
from proxy.stages.admit import _slots
from tests.fakes import FakeOpenAI
from tests.scripted import Script, ScriptedBackend


def chat(first: str = "hi", *later: str) -> ChatRequest:
    msgs = [Message("system", "be brief"), Message("user", first)]
    for text in later:
        msgs += [Message("assistant", "ok"), Message("user", text)]
    return ChatRequest(model="tiny:latest", messages=msgs)


def replica_set(*scripts: Script, **options: object) -> tuple[ReplicaSet, list[ScriptedBackend]]:
    members = [ScriptedBackend(f"r{i}", script=s) for i, s in enumerate(scripts)]
    cfg = BackendConfig(name="set", kind="openai", urls=[f"http://r{i}" for i in range(len(members))])
    return ReplicaSet(cfg, list(members), ReplicaOptions(**options)), members  # type: ignore[arg-type]


async def text(rs: ReplicaSet, req: ChatRequest | None = None) -> str:
    return "".join([c.text async for c in rs.chat(req or chat())])


async def test_least_outstanding_requests_spreads_concurrent_streams():
    rs, members = replica_set(*[Script(delay=0.05)] * 3)
    await asyncio.gather(*[text(rs) for _ in range(6)])
    assert [len(m.requests) for m in members] == [2, 2, 2]
    assert all(r.outstanding == 0 for r in rs.replicas)


async def test_failure_before_first_chunk_fails_over_invisibly():
    rs, members = replica_set(Script(fail_after=0), Script())
    assert await text(rs) == "Hello world"
    assert [len(m.requests) for m in members] == [1, 1] and rs.replicas[0].failures == 1


async def test_failure_mid_stream_is_not_retried():
    rs, members = replica_set(Script(fail_after=1), Script(fail_after=1))
    with pytest.raises(BackendError):
        await text(rs)
    assert sum(len(m.requests) for m in members) == 1


async def test_client_errors_are_not_retried_elsewhere():
    rs, members = replica_set(Script(), Script())

    async def reject(req):  # noqa: ANN001
        raise BadRequest("bad")
        yield  # pragma: no cover - makes this an async generator
    members[0].chat = reject  # type: ignore[method-assign]
    members[1].chat = reject  # type: ignore[method-assign]
    with pytest.raises(BadRequest):
        await text(rs)


async def test_a_replica_without_the_model_passes_the_request_on_and_none_with_it_is_a_404():
    """A pull that missed a replica (its circuit open, or down) left it without the model: its 404 went to the client,
    whichever replica the request chanced on, though the others had the model."""
    rs, members = replica_set(Script(), Script())

    async def lacks(req):  # noqa: ANN001 - as Ollama answers a model it does not have
        raise ModelNotFound(req.model)
        yield  # pragma: no cover - makes this an async generator
    members[0].chat = lacks  # type: ignore[method-assign]
    assert [await text(rs) for _ in range(4)] == ["Hello world"] * 4
    assert len(members[1].requests) == 4 and rs.replicas[0].failures == 0  # a missing model is no broken replica
    members[1].chat = lacks  # type: ignore[method-assign]
    with pytest.raises(ModelNotFound):
        await text(rs)


async def test_a_replica_without_the_model_beside_one_loading_it_waits_for_the_load():
    """Only replicas all loading were waited for: one lacking the model made it an immediate 503."""
    rs, members = replica_set(Script(), Script())
    asked = []

    async def lacks(req):  # noqa: ANN001
        raise ModelNotFound(req.model)
        yield  # pragma: no cover - makes this an async generator

    async def loading_then_ready(req):  # noqa: ANN001
        asked.append(req)
        if len(asked) == 1:
            raise Loading("backend 'r1' is still loading its model")
        yield Chunk(text="Hello", finish_reason="stop")
    members[0].chat, members[1].chat = lacks, loading_then_ready  # type: ignore[method-assign]
    assert await text(rs) == "Hello" and len(asked) == 2


async def test_the_set_lists_what_any_replica_has():
    """The set's listing was one replica's: a model a pull missed on it was unknown to the router, a 404."""
    rs, members = replica_set(Script(), Script())
    members[0].models, members[1].models = ["tiny:latest"], ["tiny:latest", "new:1b"]
    assert sorted(m.name for m in await rs.list_models()) == ["new:1b", "tiny:latest"]

    async def down() -> list:
        raise BackendUnavailable("r0 is down")
    members[0].list_models = down  # type: ignore[method-assign]
    assert sorted(m.name for m in await rs.list_models()) == ["new:1b", "tiny:latest"]  # one down fails none


async def test_a_replica_that_does_not_answer_its_listing_leaves_the_others_listed():
    """Every replica's listing was waited for: one that hung held the set's past the router's 3 s, and the set went
    unlisted (/api/tags empty, /api/ps hung for total_timeout)."""
    rs, members = replica_set(Script(), Script())
    members[1].models = ["new:1b"]

    async def hangs() -> list:
        await asyncio.Event().wait()
        return []
    members[1].list_models = members[1].running = hangs  # type: ignore[method-assign]
    listed = await asyncio.wait_for(rs.list_models(), 2)
    assert [m.name for m in listed] == ["tiny:latest"] and await asyncio.wait_for(rs.running(), 2) is not None


async def test_a_replica_failing_its_probes_is_not_asked_for_listings_while_another_answers():
    """It was asked every listing round, and each failure counted toward its circuit."""
    rs, members = replica_set(Script(), Script())
    asked = []

    async def down() -> list:
        asked.append(1)
        raise BackendUnavailable("r1 is down")
    members[1].list_models = down  # type: ignore[method-assign]
    rs.replicas[1].healthy = False
    rs.replicas[0].failures = 2
    for _ in range(3):
        assert [m.name for m in await rs.list_models()] == ["tiny:latest"]
    assert asked == [] and [r.failures for r in rs.replicas] == [0, 0]  # an answer resets a replica's count


async def test_a_stream_refused_before_it_opens_counts_its_replica_down_again():
    """A backend whose `chat` raises at once (the openai adapter on a client's bad Go template) left its replica's
    count of outstanding requests one higher for good, which skewed least-busy and affinity choices."""
    rs, members = replica_set(Script(), Script())

    def refuse(req):  # noqa: ANN001
        raise BadRequest("template: missing {{ end }}")
    members[0].chat = members[1].chat = refuse  # type: ignore[method-assign]
    for _ in range(3):
        with pytest.raises(BadRequest):
            await text(rs)
    assert [r.outstanding for r in rs.replicas] == [0, 0]


async def test_circuit_opens_after_repeated_failures_and_closes_after_cooldown():
    rs, members = replica_set(Script(fail_after=0), Script(), breaker_failures=2, breaker_cooldown_s=0.2)
    for _ in range(4):
        assert await text(rs) == "Hello world"
    assert len(members[0].requests) == 2  # then its circuit opened and it got nothing more
    members[0].script = Script()
    await asyncio.sleep(0.25)
    rs.replicas[1].outstanding = 5  # make the recovered replica the obvious choice
    assert await text(rs) == "Hello world"
    assert len(members[0].requests) == 3 and rs.replicas[0].failures == 0


async def test_every_circuit_open_is_a_fast_503_with_retry_after():
    rs, _ = replica_set(Script(fail_after=0), Script(fail_after=0), breaker_failures=1, breaker_cooldown_s=5)
    with pytest.raises(BackendUnavailable):
        await text(rs)
    with pytest.raises(BackendUnavailable) as info:
        await text(rs)
    assert info.value.status == 503 and 0 < info.value.retry_after <= 5


async def test_probe_marks_unhealthy_replicas_last_resort_and_recovery():
    rs, members = replica_set(Script(), Script())

    async def down() -> bool:
        return False
    members[0].health = down  # type: ignore[method-assign]
    await rs.probe()
    assert [r.healthy for r in rs.replicas] == [False, True] and await rs.health()
    for _ in range(3):
        await text(rs)
    assert [len(m.requests) for m in members] == [0, 3]
    del members[0].health
    await rs.probe()
    assert rs.replicas[0].healthy


async def test_a_replica_down_when_the_set_starts_is_out_from_the_start():
    """Replicas started counted healthy: one down when Velo started held its slots in the set's and took the first
    requests (each failing over) until the first probe, `health_interval_s` (5 s) later."""
    rs, members = replica_set(Script(fail_after=0), Script(), health_interval_s=60)

    async def down() -> bool:
        return False
    members[0].health = down  # type: ignore[method-assign]
    await rs.start()
    try:
        assert [r.healthy for r in rs.replicas] == [False, True] and await rs.concurrency() == 4
        for _ in range(3):
            assert await text(rs) == "Hello world"
        assert [len(m.requests) for m in members] == [0, 3]
    finally:
        await rs.close()


@pytest.mark.parametrize("how", ["one fails", "cancelled"])
async def test_a_replica_start_that_fails_or_is_cancelled_ends_the_others(how: str):
    """The replicas' starts were gathered: when one raised, the others ran on past the set's failed start (and a
    refused reload's close), opening what nothing would close. Each start still running is cancelled, and over,
    before the set's start raises."""
    rs, members = replica_set(Script(), Script())
    began, ended = asyncio.Event(), []

    async def hangs() -> None:
        began.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("r0")

    async def fails() -> None:
        await began.wait()
        if how == "one fails":
            raise BackendUnavailable("r1 cannot start")
        await asyncio.Event().wait()
    members[0].start, members[1].start = hangs, fails  # type: ignore[method-assign]
    starting = asyncio.ensure_future(rs.start())
    await began.wait()
    if how == "cancelled":  # a Ctrl-C, or a reload refused by another backend's start
        starting.cancel()
    with pytest.raises(asyncio.CancelledError if how == "cancelled" else BackendUnavailable):
        await starting
    assert ended == ["r0"] and rs._prober is None


async def _silent_server() -> tuple[asyncio.Server, str, list[bytes], asyncio.Event]:
    """A replica that accepts and reads each request and answers none (hung) until `answer` is set, then lists "m"
    to each; the heads it read."""
    heads: list[bytes] = []
    answer = asyncio.Event()
    listing = b'{"object":"list","data":[{"id":"m","object":"model"}]}'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                heads.append(await reader.readuntil(b"\r\n\r\n"))
                await answer.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(listing), listing))
                await writer.drain()
        writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", heads, answer


async def test_a_replica_hung_on_its_first_probe_neither_holds_the_sets_start_nor_misses_it():
    """A replica that accepted and never answered its probe held the set's start for the probe's bound,
    `health_interval_s` (the set unserved though another replica was ready), and, given up, waited out a whole
    interval more once it did answer. The set serves once a replica passes; the hung one is out of service until
    its own probe answers, and joins then."""
    server, url, heads, answer = await _silent_server()
    async with server, FakeOpenAI(models=["m"]) as live:
        rs = make_backend(BackendConfig(name="set", kind="openai", urls=[url, live.url], models=["m"],
                                        options={"health_interval_s": 10.0}))
        assert isinstance(rs, ReplicaSet)
        told: list[int] = []
        await rs.start()
        try:
            rs.watch_slots(told.append)
            assert [r.healthy for r in rs.replicas] == [False, True] and not answer.is_set()
            assert await text(rs, ChatRequest(model="m", messages=[Message("user", "hi")])) == live.script.reply
            answer.set()  # the hung replica's first probe is answered (its only probe so far)

            async def joined() -> None:
                while told != [4, 8]:
                    await asyncio.sleep(0.01)
            await asyncio.wait_for(joined(), 30)
            assert rs.replicas[0].healthy and len(heads) == 1
        finally:
            await rs.close()


async def test_a_set_start_cancelled_while_its_replicas_are_probed_leaves_no_probe_running():
    """The first probes run in the set's prober, which its start waits on: cancelled then (a Ctrl-C, a reload refused
    by another backend's start), the start ends them, and its prober, before it raises."""
    rs, members = replica_set(Script(), Script())
    asked, ended = asyncio.Queue(), []  # type: ignore[var-annotated]
    for member in members:
        async def hangs(name: str = member.name) -> bool:
            asked.put_nowait(name)
            try:
                await asyncio.Event().wait()
            finally:
                ended.append(name)
            return True
        member.health = hangs  # type: ignore[method-assign]
    starting = asyncio.ensure_future(rs.start())
    for _ in members:
        await asyncio.wait_for(asked.get(), 10)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert sorted(ended) == ["r0", "r1"]
    assert not [task for task in asyncio.all_tasks() if task.get_name() == "health:set" and not task.done()]


async def test_prefix_affinity_keeps_a_conversation_on_one_replica():
    rs, members = replica_set(Script(), Script(), Script(), affinity="prefix")
    for turn in range(4):
        await text(rs, chat("conversation A", *["more"] * turn))
    assert sorted(len(m.requests) for m in members) == [0, 0, 4]
    for i in range(30):
        await text(rs, chat(f"conversation {i}"))
    assert all(m.requests for m in members)  # different conversations spread out


async def test_prefix_affinity_reads_a_prompt_of_token_ids_by_its_ids():
    """Their text prompt is "" in every one: keyed by it, every prompt of ids went to one replica."""
    rs, members = replica_set(Script(), Script(), Script(), affinity="prefix")

    async def complete(ids: list[int]) -> None:
        [c async for c in rs.complete(CompletionRequest("tiny:latest", "", prompt_ids=ids, raw=True))]
    for _ in range(3):
        await complete([1, 2, 3])
    assert sorted(len(m.requests) for m in members) == [0, 0, 3]
    for i in range(30):
        await complete([i, 2, 3])
    assert all(m.requests for m in members)


async def test_affinity_yields_to_load_when_the_preferred_replica_is_busy():
    rs, members = replica_set(Script(), Script(), affinity="prefix")
    await text(rs, chat("sticky"))
    preferred = next(r for r, m in zip(rs.replicas, members) if m.requests)
    preferred.outstanding = 10
    await text(rs, chat("sticky"))
    assert [len(m.requests) for m in members] == [1, 1]


async def test_closing_a_stream_early_releases_the_replica():
    rs, members = replica_set(Script(pieces=["x"] * 50, delay=0.01))
    async with contextlib.aclosing(rs.chat(chat())) as stream:
        async for _ in stream:
            break
    assert rs.replicas[0].outstanding == 0 and members[0].cancelled == 1


async def test_registry_builds_a_replica_set_that_fails_over_to_a_live_server(dead_port):
    async with FakeOpenAI(models=["m"]) as live, FakeOpenAI(models=["m"]) as failing:
        failing.script.fail_status = 503
        cfg = BackendConfig(name="pool", kind="openai", urls=[f"http://127.0.0.1:{dead_port}", failing.url, live.url],
                            max_concurrency=2, options={"affinity": "none", "breaker_failures": 1})
        backend = make_backend(cfg)
        assert isinstance(backend, ReplicaSet) and await backend.concurrency() == 6
        assert [r.backend.name for r in backend.replicas] == ["pool[0]", "pool[1]", "pool[2]"]
        app = make_app(Config(default_backend="pool", backends=[cfg]), {"pool": backend})
        async with TestClient(TestServer(app)) as c:
            for _ in range(2):
                resp = await c.post("/v1/chat/completions",
                                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["choices"][0]["message"]["content"].startswith("Hello")
            scraped = await (await c.get("/metrics")).text()
        assert 'velo_replica_up{backend="pool",replica="pool[0]"} 0.0' in scraped
        assert 'velo_replica_up{backend="pool",replica="pool[1]"} 0.0' in scraped
        assert 'velo_replica_up{backend="pool",replica="pool[2]"} 1.0' in scraped
        assert 'velo_replica_outstanding{backend="pool",replica="pool[2]"} 0.0' in scraped
        chats = [r for r in live.requests if r.path == "/v1/chat/completions"]
        assert len(chats) == 2  # the set's start probed each replica: the failing one was asked nothing past its probe
        assert [(r.method, r.path) for r in failing.requests] == [("GET", "/v1/models")]


@pytest.mark.parametrize("always_stream", [True, False])
async def test_a_one_answer_request_a_replica_cut_mid_generation_is_not_sent_again(always_stream):
    """Each replica's adapter folded its stream into one chunk, so a replica that failed mid-generation had not yet
    sent a "first chunk" and the request went again to the next (with the SDKs' retries, one call cost six
    generations). With `always_stream = false` the backend is asked for one answer, and its cut is one too."""
    async with FakeOpenAI(models=["m"]) as cut, FakeOpenAI(models=["m"]) as whole:
        cut.script.cut_after = 3
        cfg = BackendConfig(name="pool", kind="openai", urls=[cut.url, whole.url], always_stream=always_stream,
                            options={"affinity": "none"})
        backend = make_backend(cfg)
        try:
            req = ChatRequest(model="m", messages=[Message("user", "hi")], stream=False)
            if always_stream:
                with pytest.raises(BackendError):
                    [c async for c in backend.chat(req)]
                assert [len([r for r in f.requests if r.path == "/v1/chat/completions"]) for f in (cut, whole)] == \
                    [1, 0]
            else:  # nothing streamed to cut: the whole answer comes from the first replica
                assert "".join([c.text async for c in backend.chat(req)]).startswith("Hello")
            cut.script.cut_after = None
            streamed = [c async for c in backend.chat(ChatRequest(model="m", messages=[Message("user", "hi")]))]
            assert len(streamed) > 1  # a streamed request is still a stream
        finally:
            await backend.close()


def test_bad_affinity_is_a_named_config_error():
    with pytest.raises(ValueError, match="options.affinity"):
        ReplicaOptions.split({"affinity": "sticky"})


async def test_concurrency_adds_up_replicas_and_tolerates_one_that_is_down():
    rs, members = replica_set(Script(), Script(), Script())

    async def down() -> int:
        raise BackendUnavailable("not reachable")
    members[1].concurrency = down  # type: ignore[method-assign]
    members[0].config.max_concurrency = 2
    assert await rs.concurrency() == 2 + 4 + 4
    for member in members:  # none can say: the admit stage is told, and asks again until they can
        member.concurrency = down  # type: ignore[method-assign]
    with pytest.raises(BackendUnavailable):
        await rs.concurrency()


async def test_the_sets_slots_are_those_of_its_replicas_in_service():
    """Told as they change: a replica failing its probes or with its circuit open takes its slots out; none in
    service leaves one replica's worth, for requests to try them; a replica back (its probe, or a request out of its
    cool-down succeeding) brings its own back."""
    rs, members = replica_set(Script(), Script(), breaker_failures=1, breaker_cooldown_s=0.1)
    members[0].config.max_concurrency, members[1].config.max_concurrency = 2, 3
    told: list[int] = []
    assert await rs.concurrency() == 5
    rs.watch_slots(told.append)
    healthy = [False, True]
    for i, member in enumerate(members):
        async def health(i: int = i) -> bool:
            return healthy[i]
        member.health = health  # type: ignore[method-assign]
    for up in ([False, True], [False, False], [True, False], [True, True]):
        healthy[:] = up
        await rs.probe()
    assert told == [3, 2, 5]  # none in service: the larger replica's 3
    members[1].script = Script(fail_after=0)
    rs.replicas[0].outstanding = 5  # the request goes to the failing replica first, then over
    assert await text(rs) == "Hello world" and told == [3, 2, 5, 2]
    members[1].script = Script()
    await asyncio.sleep(0.15)
    assert await text(rs) == "Hello world" and told == [3, 2, 5, 2, 5]


async def test_a_replica_that_never_said_its_slots_is_asked_when_its_probe_passes():
    """A replica down when the set was asked its slots counted as the configured limit or 4 once back, and was never
    asked again: a llama-server of 1 slot took 4 requests at once, 3 queued in its own queue outside Velo's."""
    rs, members = replica_set(Script(), Script())
    up, says = [False, True], [True, True]
    for i, member in enumerate(members):
        async def health(i: int = i) -> bool:
            return up[i]

        async def concurrency(i: int = i) -> int:
            if not (up[i] and says[i]):
                raise BackendUnavailable("not reachable")
            return (1, 3)[i]
        member.health, member.concurrency = health, concurrency  # type: ignore[method-assign]
    await rs.probe()
    assert await rs.concurrency() == 3 and rs.replicas[0].slots is None
    told: list[int] = []
    rs.watch_slots(told.append)
    up[0], says[0] = True, False  # back, but its slots not yet said (/props failing): 4 until it says
    await rs.probe()
    says[0] = True
    await rs.probe()
    assert told == [7, 4] and rs.replicas[0].slots == 1


@pytest.mark.parametrize("answers_health, slots", [(False, 2), (True, 2 + 4)])
async def test_a_replica_that_hangs_leaves_the_sets_slots_to_those_that_answered(answers_health: bool, slots: int):
    """Every replica's slots were waited for: one that accepted and never answered (on everything, or on /props
    only: then it counts 4 until it says) held the set's past the admit stage's 5 s bound, so that the set's queue
    was never sized from the replicas that had answered. The set's start is bounded by its probe's own bound."""
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def props(_: web.Request) -> web.Response:
        return web.json_response({"total_slots": 2})

    async def never(_: web.Request) -> web.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")
    live, hung = web.Application(), web.Application()
    live.router.add_get("/health", health)
    live.router.add_get("/props", props)
    if answers_health:
        hung.router.add_get("/health", health)
    hung.router.add_get("/{tail:.*}", never)
    async with TestServer(live) as up, TestServer(hung) as down:
        urls = [str(up.make_url("")), str(down.make_url(""))]
        rs = make_backend(BackendConfig(name="set", kind="llamacpp", urls=urls, options={"health_interval_s": 1.0}))
        loop = asyncio.get_running_loop()
        began = loop.time()
        await rs.start()
        try:
            assert loop.time() - began < 1.5
            assert [r.healthy for r in rs.replicas] == [True, answers_health]  # type: ignore[attr-defined]
            began = loop.time()
            assert await _slots(rs) == slots and loop.time() - began < 1.5
        finally:
            await rs.close()


class _Counted(FakeOpenAI):
    """Counts the chats it runs at once."""

    def __init__(self) -> None:
        super().__init__(models=["m"])
        self.running = self.peak = 0

    async def chat(self, request):  # noqa: ANN001, ANN201
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            return await super().chat(request)
        finally:
            self.running -= 1


async def test_the_queue_holds_what_the_replicas_out_of_service_would_have_taken():
    """With one of two replicas of 2 slots out (its circuit open), 4 requests went at once to the other, which
    queued half in its own queue, outside Velo's order and its queue_timeout_s; its slots come back with it."""
    async with _Counted() as out, _Counted() as live:
        for fake in (out, live):
            fake.script.token_delay = 0.02
        cfg = BackendConfig(name="pool", kind="openai", urls=[out.url, live.url], max_concurrency=2,
                            options={"affinity": "none", "breaker_failures": 1, "breaker_cooldown_s": 0.3})
        app = make_app(Config(default_backend="pool", backends=[cfg]), {"pool": make_backend(cfg)})
        async with TestClient(TestServer(app)) as c:
            async def ask() -> None:
                resp = await c.post("/v1/chat/completions", json={"model": "m", "stream": True,
                                                                  "messages": [{"role": "user", "content": "hi"}]})
                assert resp.status == 200, await resp.text()
                await resp.read()

            async def gauge(name: str) -> float:
                scraped = await (await c.get("/metrics")).text()
                return float(next(line.split()[-1] for line in scraped.splitlines()
                                  if line.startswith(f'{name}{{backend="pool"}}')))
            assert await gauge("velo_backend_slots") == 4
            out.script.fail_status = 500
            await ask()  # the first replica fails (the listing, or the chat it fails over), and its circuit opens
            assert await gauge("velo_backend_slots") == 2
            burst, deepest = asyncio.ensure_future(asyncio.gather(*[ask() for _ in range(6)])), 0.0
            while not burst.done():
                deepest = max(deepest, await gauge("velo_queue_depth"))
                await asyncio.sleep(0.01)
            await burst
            assert live.peak == 2 and deepest > 0  # the rest waited in Velo's queue, not in the replica's
            out.script.fail_status = None
            await asyncio.sleep(0.35)  # its cool-down: the next request is its to try, and its success restores it
            await asyncio.gather(*[ask() for _ in range(8)])
            assert await gauge("velo_backend_slots") == 4 and live.peak == 2 and out.peak == 2


@pytest.mark.parametrize("kind, traits", [
    ("llamacpp", {"answers_unlisted_names": True, "constrains_format": True, "fits_context": False}),
    ("ollama", {"answers_unlisted_names": False, "fits_context": True, "own_defaults": "ollama"}),
    ("openai", {"answers_unlisted_names": False, "constrains_format": False, "forces_tool_choice": False})])
def test_a_replica_set_has_the_traits_of_the_servers_it_stands_for(kind, traits):
    backend = make_backend(BackendConfig(name="pool", kind=kind, urls=["http://a:1", "http://b:2"]))
    assert isinstance(backend, ReplicaSet)
    assert {trait: getattr(backend, trait) for trait in traits} == traits


@pytest.mark.parametrize("fault, status", [("slow", 504), ("busy", 429), ("mixed", 503)])
async def test_every_replica_failing_says_how(fault: str, status: int):
    """Each replica timing out is a 504 and each one busy a 429, as one backend's would be; a 503 ("unavailable")
    hid a hung set behind a down one."""
    async with FakeOpenAI(models=["m"]) as a, FakeOpenAI(models=["m"]) as b:
        for fake in (a, b):
            if fault == "slow":
                fake.script.token_delay = 1.0
            else:
                fake.script.fail_status = 429
        if fault == "mixed":
            b.script.fail_status = 503
        cfg = BackendConfig(name="pool", kind="openai", urls=[a.url, b.url], first_token_timeout=0.2,
                            options={"affinity": "none"})
        app = make_app(Config(default_backend="pool", backends=[cfg]), {"pool": make_backend(cfg)})
        async with TestClient(TestServer(app)) as c:
            resp = await c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
            body = await resp.json()
        assert resp.status == status, body
        assert "every replica of backend 'pool' failed" in body["error"]["message"]


async def test_a_replica_silent_past_first_token_timeout_is_given_up_for_the_next():
    """The one resend README's Errors allows: a hung replica (nothing within first_token_timeout) is closed and the
    request answered by the next, so the client sees the answer, not the hang."""
    async with FakeOpenAI(models=["m"]) as hung, FakeOpenAI(models=["m"]) as ready:
        hung.script.token_delay = 1.0
        cfg = BackendConfig(name="pool", kind="openai", urls=[hung.url, ready.url], first_token_timeout=0.3,
                            options={"affinity": "none", "breaker_failures": 1})
        app = make_app(Config(default_backend="pool", backends=[cfg]), {"pool": make_backend(cfg)})
        async with TestClient(TestServer(app)) as c:
            for _ in range(2):  # the least busy replica is either one: two requests reach the hung one once
                resp = await c.post("/v1/chat/completions", json={"model": "m", "messages": [
                    {"role": "user", "content": "hi"}]})
                body = await resp.json()
                assert resp.status == 200, body
                assert body["choices"][0]["message"]["content"] == ready.script.reply
        chats = [r for r in hung.requests if r.path == "/v1/chat/completions"]
        assert len(chats) == 1  # its circuit opened after it hung: the second request never went there


async def test_every_replica_busy_says_the_soonest_retry_after():
    rs, members = replica_set(Script(), Script())
    for member, wait in zip(members, (3.0, 1.0)):
        async def busy(req, wait=wait):  # noqa: ANN001
            raise Overloaded("queue full", retry_after=wait)
            yield  # pragma: no cover - makes this an async generator
        member.chat = busy  # type: ignore[method-assign]
    with pytest.raises(Overloaded) as info:
        await text(rs)
    assert info.value.status == 429 and info.value.retry_after == 1.0


async def test_a_replica_that_said_it_is_busy_is_asked_last_until_its_retry_after():
    """Busy is not broken (its circuit stays closed), but every request asked it first, a round trip more each."""
    rs, members = replica_set(Script(), Script())
    asked = []

    async def busy(req):  # noqa: ANN001
        asked.append(req)
        raise Overloaded("queue full", retry_after=9.0)
        yield  # pragma: no cover - makes this an async generator
    members[0].chat = busy  # type: ignore[method-assign]
    for _ in range(4):  # one at a time: each finds both replicas idle, the first listed first
        assert await text(rs) == "Hello world"
    assert len(asked) == 1 and len(members[1].requests) == 4
    assert rs.replicas[0].failures == 0  # busy, not failing: its circuit stays as it was


async def test_replicas_down_and_busy_say_the_soonest_retry_after_either_gave():
    """One replica down for 5 s (a 503 saying so), the other busy for 3 s (a 429): the set's 503 went out without a
    Retry-After, where each alone passes its own on."""
    async with FakeOpenAI(models=["m"]) as a, FakeOpenAI(models=["m"]) as b:
        a.script.fail_status, a.script.fail_retry_after = 503, "5"
        b.script.fail_status, b.script.fail_retry_after = 429, "3"
        cfg = BackendConfig(name="pool", kind="openai", urls=[a.url, b.url], options={"affinity": "none"})
        app = make_app(Config(default_backend="pool", backends=[cfg]), {"pool": make_backend(cfg)})
        async with TestClient(TestServer(app)) as c:
            resp = await c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
            assert resp.status == 503 and resp.headers.get("Retry-After") == "3", await resp.text()


async def _taking_server(cut_body: bool) -> tuple[asyncio.Server, str, list[bytes]]:
    """A replica that reads each POST whole, then drops the connection (crashing on it), or with `cut_body` sends
    the head and part of a whole answer first (cut mid-generation)."""
    posts: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        if head.startswith(b"POST"):
            posts.append(head)
            if cut_body:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
                             b'{"id":"x","choices":[{"ind')
                await writer.drain()
        writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", posts


@pytest.mark.parametrize("cut_body, always_stream", [(False, True), (False, False), (True, False)])
async def test_a_request_a_replica_may_have_run_is_not_sent_to_the_next(cut_body, always_stream):
    """A replica that read the request and dropped the connection, or cut a whole answer (always_stream = false):
    each replica was sent it in turn, so a request that crashed one crashed them all, and a cut generation ran
    again."""
    server, url, posts = await _taking_server(cut_body)
    async with server, FakeOpenAI(models=["m"]) as whole:
        cfg = BackendConfig(name="pool", kind="openai", urls=[url, whole.url], models=["m"],
                            always_stream=always_stream, options={"affinity": "none"})
        backend = make_backend(cfg)
        try:
            with pytest.raises(BackendError) as failed:
                [c async for c in backend.chat(ChatRequest(model="m", messages=[Message("user", "hi")],
                                                           stream=False))]
        finally:
            await backend.close()
    assert failed.value.taken and len(posts) == 1
    assert not [r for r in whole.requests if r.path == "/v1/chat/completions"]
    assert [r.failures for r in backend.replicas] == [1, 0]  # once: it was counted twice, opening circuits early


async def test_a_replica_loading_its_model_is_passed_over_and_all_loading_are_waited_for():
    """llama-server answers 503 "Loading model" while it loads: a set waited the load out (up to
    first_token_timeout, 300 s by default) on that replica with another one ready; when every replica loads, the
    request waits for the first ready, as with one backend."""
    async with FakeOpenAI(models=["m"]) as loading, FakeOpenAI(models=["m"]) as ready:
        loading.script.fail_status, loading.script.fail_message = 503, "Loading model"
        cfg = BackendConfig(name="pool", kind="openai", urls=[loading.url, ready.url], first_token_timeout=30,
                            options={"affinity": "none"})
        backend = make_backend(cfg)
        try:
            req = ChatRequest(model="m", messages=[Message("user", "hi")])
            assert "".join([c.text async for c in backend.chat(req)])
            # asked once, not every 0.25 s until its load was over
            assert len([r for r in loading.requests if r.path == "/v1/chat/completions"]) <= 1
            assert [r.failures for r in backend.replicas] == [0, 0]  # loading is not broken
            ready.script.fail_status, ready.script.fail_message = 503, "Loading model"

            async def loaded() -> None:
                await asyncio.sleep(0.6)
                ready.script.fail_status = None
            asyncio.create_task(loaded())
            assert "".join([c.text async for c in backend.chat(req)])
        finally:
            await backend.close()


async def test_what_one_replica_lists_of_its_server_is_known_of_all():
    """Only the replica that listed knew it was vLLM: a prefill was continued on it and answered as a new turn on
    the other, and only it got each key's cache_salt."""
    async with FakeOpenAI(models=["m"], owner="vllm") as a, FakeOpenAI(models=["m"], owner="vllm") as b:
        backend = make_backend(BackendConfig(name="pool", kind="openai", urls=[a.url, b.url]))
        try:
            await backend.list_models()
            assert [r.backend.server for r in backend.replicas] == ["vllm", "vllm"]
        finally:
            await backend.close()


async def test_ollama_replicas_each_load_unload_and_pull():
    """Against Ollama's protocol double: a set's bare load and keep_alive 0 reached no replica, and a pull only
    one, so the model pulled there was a 404 on the other."""
    from tests.fakes import OllamaDouble
    async with OllamaDouble() as a, OllamaDouble() as b:
        cfg = BackendConfig(name="pool", kind="ollama", urls=[a.url, b.url])
        app = make_app(Config(default_backend="pool", backends=[cfg]), {"pool": make_backend(cfg)})
        async with TestClient(TestServer(app)) as c:
            for body in ({"model": "smollm2:135m"}, {"model": "smollm2:135m", "keep_alive": 0}):
                assert (await c.post("/api/generate", json=body)).status == 200
            pulled = await c.post("/api/pull", json={"model": "new:1b", "stream": False})
            assert pulled.status == 200 and (await pulled.json())["status"] == "success"
        for fake in (a, b):
            assert [r.path for r in fake.requests if r.path in ("/api/generate", "/api/pull")] == \
                ["/api/generate", "/api/generate", "/api/pull"]
            assert "new:1b" in fake.models


async def test_a_replica_down_does_not_fail_the_others_bare_load_or_unload(dead_port):
    """One unreachable replica made the set's bare load (and keep_alive 0) a 503, the others' loads left running."""
    from tests.fakes import OllamaDouble
    async with OllamaDouble() as up:
        cfg = BackendConfig(name="pool", kind="ollama", urls=[up.url, f"http://127.0.0.1:{dead_port}"])
        backend = make_backend(cfg)
        try:
            assert await backend.load("smollm2:135m", None) >= 0
            await backend.unload("smollm2:135m")
            assert [r.failures for r in backend.replicas] == [0, 2]  # said and counted, not dropped
        finally:
            await backend.close()
    assert [r.path for r in up.requests if r.path == "/api/generate"] == ["/api/generate"] * 2
