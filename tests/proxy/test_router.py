from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from adapters.errors import BackendUnavailable, ModelNotFound
from adapters.protocol import ModelInfo
from proxy.app import make_app
from proxy.cache.config import CacheConfig
from proxy.config import Config, parse_config
from proxy.presets import Preset, PresetStore
from proxy.router import Router, Target
from tests.fakes import FakeOpenAI, FakeServer, OllamaDouble
from tests.scripted import ScriptedBackend


ONE_LLAMA = {"backends": [{"name": "b", "kind": "llamacpp", "url": "http://v:1"}]}


def _router(**extra) -> tuple[Router, ScriptedBackend, ScriptedBackend]:
    cfg = parse_config({"backends": [{"name": "a", "kind": "ollama", "url": "http://u:1"},
                                     {"name": "b", "kind": "llamacpp", "url": "http://v:1"}], **extra})
    a, b = (ScriptedBackend("a", ("llama3:latest", "shared:latest")),
            ScriptedBackend("b", ("qwen-coder", "shared:latest")))
    return Router(cfg, {"a": a, "b": b}), a, b


async def test_listing_is_the_union_and_first_backend_wins_duplicates():
    router, *_ = _router()
    listed = {m.name: m.backend for m in await router.list_models()}
    assert listed == {"llama3:latest": "a", "shared:latest": "a", "qwen-coder": "b"}


async def test_resolution_order_alias_exact_glob_listing_default():
    router, a, b = _router(routes=[{"match": "qwen*", "backend": "b"}, {"match": "special", "backend": "b",
                                                                       "model": "renamed"}],
                           aliases={"gpt-4o": "b:qwen-coder", "fast": "llama3", "mini": "shared:latest"},
                           default_backend="a")
    assert (t := await router.resolve("gpt-4o")).backend is b and t.model == "qwen-coder"
    assert (await router.resolve("special")).model == "renamed"
    assert (await router.resolve("qwen2.5")).backend is b
    assert (t := await router.resolve("llama3")).backend is a and t.model == "llama3:latest"
    assert (await router.resolve("fast")).model == "llama3:latest"
    assert (t := await router.resolve("mini")).backend is a and t.model == "shared:latest"  # "shared" is no backend
    assert (await router.resolve("unknown-model")).backend is a  # the default takes the rest


async def test_a_tagged_name_finds_a_model_listed_without_its_tag():
    """Ollama treats `x` and `x:latest` as one model either way round: LiteLLM users copy tagged names
    (`ollama_chat/qwen-coder:latest`), which found no model listed as `qwen-coder` (a 404)."""
    router, _, b = _router()
    assert (t := await router.resolve("qwen-coder:latest")).backend is b and t.model == "qwen-coder"
    with pytest.raises(ModelNotFound):
        await router.resolve("qwen-coder:7b")


async def test_unknown_model_without_default_is_404():
    router, *_ = _router()
    with pytest.raises(ModelNotFound, match="model 'nope' not found"):
        await router.resolve("nope")


@pytest.mark.parametrize("answers_unlisted", [False, True])
async def test_the_only_backend_takes_unknown_names_unless_it_would_answer_them_with_another_model(answers_unlisted):
    """A single-model llama-server answers any name with its one: a name it did not list is Ollama's 404 there
    (Home Assistant kept `llama3.2:latest` and got Qwen's answers under that name). A backend that answers for
    itself (Ollama's own 404, vLLM's) gets every name; so does a llama-server whose listing never came, and the
    configured default backend."""
    backend = ScriptedBackend("b", ("qwen-coder",))
    backend.answers_unlisted_names = answers_unlisted  # type: ignore[misc]
    router = Router(parse_config(ONE_LLAMA), {"b": backend})
    assert (await router.resolve("qwen-coder")).backend is backend
    if answers_unlisted:
        with pytest.raises(ModelNotFound, match="model 'llama3.2:latest' not found"):
            await router.resolve("llama3.2:latest")
    else:
        assert (await router.resolve("llama3.2:latest")).backend is backend
    configured = Router(parse_config({"backends": [{"name": "b", "kind": "llamacpp", "url": "http://v:1"}],
                                      "default_backend": "b"}), {"b": backend})
    assert (await configured.resolve("llama3.2:latest")).backend is backend

    async def down():
        raise ConnectionError("down")
    backend.list_models = down  # type: ignore[method-assign]
    unlisted = Router(parse_config(ONE_LLAMA), {"b": backend})
    assert (await unlisted.resolve("llama3.2:latest")).backend is backend


async def test_a_servers_own_name_for_its_model_reaches_it_unlisted():
    """SillyTavern and Jan keep the model id llama-server gave them (its model path, or `--alias`): moved over to
    Velo, that name reaches the model it named, under the listed name, where it was a 404."""
    backend = ScriptedBackend("b", ("qwen-coder",))
    backend.answers_unlisted_names = True  # type: ignore[misc]
    listed = ModelInfo(name="qwen-coder", backend="b", served_as=["/models/qwen.gguf"])

    async def listing():
        return [listed]
    backend.list_models = listing  # type: ignore[method-assign]
    router = Router(parse_config(ONE_LLAMA), {"b": backend})
    target = await router.resolve("/models/qwen.gguf")
    assert (target.backend, target.model, target.label) == (backend, "qwen-coder", "/models/qwen.gguf")
    assert [m.name for m in await router.list_models()] == ["qwen-coder"]
    with pytest.raises(ModelNotFound):
        await router.resolve("/models/other.gguf")


async def test_a_down_backend_does_not_hide_the_others():
    router, a, _ = _router()

    async def broken():
        raise ConnectionError("down")
    a.list_models = broken  # type: ignore[method-assign]
    assert [m.name for m in await router.list_models()] == ["qwen-coder", "shared:latest"]


async def test_aliases_are_listed():
    router, *_ = _router(aliases={"gpt-4o": "b:qwen-coder"})
    assert "gpt-4o" in {m.name for m in await router.list_models()}


async def test_an_alias_is_listed_as_the_model_it_names():
    """A target may be a model's name as clients send it ("smollm2:135m", "llama3"), as `resolve` reads it: such an
    alias was listed as no model (the name after the colon, "latest", or one spelling only, was looked up): no
    family, no window, Velo's default capabilities and a 1970 date in /api/tags, where /api/show gave its model's."""
    router, a, b = _router(aliases={"fast": "llama3", "mini": "shared:latest", "coder": "b:qwen-coder"})
    a.capabilities = ["completion", "vision"]
    listed = {m.name: m for m in await router.list_models()}
    for alias, target in (("fast", "llama3:latest"), ("mini", "shared:latest"), ("coder", "qwen-coder")):
        shown, model = listed[alias], listed[target]
        assert (shown.family, shown.context_length, shown.capabilities, shown.modified_at, shown.backend) == (
            model.family, model.context_length, model.capabilities, model.modified_at, model.backend), alias
    assert listed["fast"].capabilities == ["completion", "vision"] and listed["fast"].family == "llama"


async def test_a_name_with_settings_of_its_own_has_a_digest_of_its_own(tmp_path):
    """llm-ollama keeps one name per digest: a preset and an alias with a [models] table shared their base's, and
    llm ran the base model without the preset's system prompt or the alias's options. A plain alias is a copy
    (Ollama's `cp`), and shares it; `name:latest` reaches an alias, as every Ollama name."""
    backend = ScriptedBackend("b", ("qwen-coder",))

    async def listing():
        return [ModelInfo(name="qwen-coder", backend="b", digest="d" * 64)]
    backend.list_models = listing  # type: ignore[method-assign]
    cfg = parse_config({"backends": [{"name": "b", "kind": "llamacpp", "url": "http://v:1"}],
                        "aliases": {"copy": "qwen-coder", "fast": "qwen-coder"},
                        "models": {"fast": {"options": {"num_predict": 3}}}})
    presets = PresetStore(tmp_path / "presets.json")
    await presets.put(Preset("pirate:latest", "qwen-coder", system="Arr."))
    router = Router(cfg, {"b": backend}, presets=presets)
    digests = {m.name: m.digest for m in await router.list_models()}
    assert digests["copy"] == digests["qwen-coder"] == "d" * 64
    assert len({digests["qwen-coder"], digests["fast"], digests["pirate:latest"]}) == 3
    assert digests == {m.name: m.digest for m in await router.list_models()}  # the same at every listing
    assert (await router.resolve("fast:latest")).label == "fast:latest"
    assert (await router.resolve("fast:latest")).model == "qwen-coder"


class Hung(ScriptedBackend):
    """A backend that accepts and never answers a listing or a model's details, counting the asks."""

    def __init__(self) -> None:
        super().__init__("hung", ("big:70b",))
        self.asked = {"list": 0, "show": 0}

    async def list_models(self):  # type: ignore[override]
        self.asked["list"] += 1
        await asyncio.Event().wait()

    async def show(self, model: str):  # type: ignore[override]
        self.asked["show"] += 1
        await asyncio.Event().wait()


def _with_hung(timeout: float) -> tuple[Router, Hung, ScriptedBackend]:
    cfg = parse_config({"backends": [{"name": "hung", "kind": "ollama", "url": "http://u:1"},
                                     {"name": "b", "kind": "llamacpp", "url": "http://v:1"}]})
    hung, fast = Hung(), ScriptedBackend("b", ("qwen-coder",))
    return Router(cfg, {"hung": hung, "b": fast}, listing_timeout=timeout, start_listing_s=timeout), hung, fast


async def test_one_hung_backend_does_not_slow_anyone_once_listings_are_kept():
    """Before: every request for a name no backend lists re-listed every backend, 3 s each with one hung."""
    router, hung, fast = _with_hung(timeout=2.0)
    await router.start()  # the first listing waits for the hung one, once, at most the timeout
    try:
        target = await asyncio.wait_for(router.resolve("qwen-coder"), 1.0)  # hang detectors: never the 2 s
        assert target.backend is fast
        for n in range(20):  # the hung one may hold it: a 503 to ask again, where a 404 said there is no such model
            with pytest.raises(BackendUnavailable, match="'hung' did not list its models yet"):
                await asyncio.wait_for(router.resolve(f"nope-{n}"), 1.0)
        assert hung.asked["list"] <= 2  # before: one listing per unknown name
    finally:
        await router.close()


async def test_a_hung_backends_model_details_are_asked_once_for_everyone():
    router, hung, _ = _with_hung(timeout=0.2)
    target = Target(hung, "big:70b")
    infos = await asyncio.gather(*(router.model_info(target) for _ in range(20)))
    assert infos == [None] * 20 and hung.asked["show"] == 1  # before: 20 asks, each waiting the timeout
    await router.close()


async def test_a_model_pulled_since_the_last_listing_is_found():
    router, a, b = _router()
    router = Router(router.config, {"a": a, "b": b}, unknown_ttl_s=0.05)
    await router.start()
    try:
        a.models.append("new:latest")
        await asyncio.sleep(0.1)  # past the time a listing counts as fresh for unknown names
        assert (await router.resolve("new")).backend is a
    finally:
        await router.close()


class SlowAtFirst(ScriptedBackend):
    """A backend whose first listing fails (busy at Velo's start), then answers, taking a moment as HTTP does."""

    def __init__(self) -> None:
        super().__init__("late", ("late:1b",))
        self.asked = 0
        self.listed = asyncio.Event()

    async def list_models(self):  # type: ignore[override]
        self.asked += 1
        if self.asked == 1:
            raise BackendUnavailable("still starting")
        await asyncio.sleep(0.05)
        self.listed.set()
        return await super().list_models()


async def test_a_backend_that_failed_its_listing_is_asked_again_on_its_own():
    """Before: a backend whose listing failed at start had its models answered 404 (without waiting for it) until
    the next full round, a minute later."""
    cfg = parse_config({"backends": [{"name": "b", "kind": "ollama", "url": "http://u:1"},
                                     {"name": "late", "kind": "ollama", "url": "http://v:1"}]})
    late = SlowAtFirst()
    router = Router(cfg, {"b": ScriptedBackend("b", ("other:1b",)), "late": late}, unknown_ttl_s=0.1)
    await router.start()
    try:
        assert late.asked == 1
        await asyncio.wait([asyncio.ensure_future(late.listed.wait())], timeout=2)
        await asyncio.sleep(0.01)
        assert (await router.resolve("late:1b")).backend is late
    finally:
        await router.close()


class SlowFirstListing(ScriptedBackend):
    """Its first listing takes longer than later ones (llama-server probing /infill: a first prompt evaluation)."""

    def __init__(self) -> None:
        super().__init__("cold", ("cold:1b",))
        self.asked = 0

    async def list_models(self):  # type: ignore[override]
        self.asked += 1
        await asyncio.sleep(0.3 if self.asked == 1 else 0.0)
        return await super().list_models()


async def test_the_first_listing_at_start_has_more_time_than_later_ones():
    cfg = parse_config({"backends": [{"name": "b", "kind": "ollama", "url": "http://u:1"},
                                     {"name": "cold", "kind": "ollama", "url": "http://v:1"}]})
    cold = SlowFirstListing()
    router = Router(cfg, {"b": ScriptedBackend("b", ("other:1b",)), "cold": cold}, listing_timeout=0.1,
                    start_listing_s=2.0)
    await router.start()
    try:
        assert (await router.resolve("cold:1b")).backend is cold and cold.asked == 1
    finally:
        await router.close()


async def test_a_backend_down_for_a_moment_keeps_what_it_said_of_a_model():
    """A failed refresh dropped the model's window and capabilities, so the fit and resolve stages checked nothing
    until the backend answered again; a model the backend no longer has is dropped."""
    class Flaky(ScriptedBackend):
        down = gone = False

        async def show(self, model: str) -> ModelInfo:
            if self.down:
                raise BackendUnavailable("down for a moment")
            if self.gone:
                raise ModelNotFound(model)
            return await super().show(model)

    flaky = Flaky("b", ("tiny:latest",))
    router = Router(parse_config({"backends": [{"name": "b", "kind": "ollama", "url": "http://u:1"}]}), {"b": flaky},
                    info_ttl_s=0)
    target = Target(flaky, "tiny:latest", "b")
    assert (await router.model_info(target)).context_length == 8192
    for down, gone, kept in ((True, False, True), (False, True, False)):
        flaky.down, flaky.gone = down, gone
        await router.model_info(target)  # the refresh runs behind the request's back
        await asyncio.sleep(0.01)
        assert ((await router.model_info(target)) is not None) == kept


async def test_the_model_info_kept_is_bounded_by_the_names_asked_most_recently(monkeypatch):
    """Made-up names sent to a default backend (each a 404 from its /api/show) grew the dict without bound."""
    from proxy import router as router_module
    monkeypatch.setattr(router_module, "_INFO_ENTRIES", 3)
    backend = ScriptedBackend("b", ("tiny:latest",))
    router = Router(parse_config({"backends": [{"name": "b", "kind": "ollama", "url": "http://u:1"}]}), {"b": backend})
    known = Target(backend, "tiny:latest", "b")
    assert await router.model_info(known) is not None
    for i in range(10):
        assert await router.model_info(Target(backend, f"made-up-{i}", "other")) is None
        await router.model_info(known)  # asked again: kept, as the most recent
    assert len(router._info) == 3 and ("b", "tiny:latest") in router._info


async def test_closing_cancels_the_show_of_an_entry_the_bound_evicted(monkeypatch):
    """An entry evicted while its refresh was still asked (a slow backend) left its task behind, which closing the
    router did not cancel: it ran on against a closed backend."""
    from proxy import router as router_module
    monkeypatch.setattr(router_module, "_INFO_ENTRIES", 1)

    class Slow(ScriptedBackend):
        slow = False

        async def show(self, model: str):
            if self.slow and model == "first":
                await asyncio.sleep(60)
            return await super().show("tiny:latest")

    backend = Slow("b", ("tiny:latest",))
    router = Router(parse_config({"backends": [{"name": "b", "kind": "ollama", "url": "http://u:1"}]}), {"b": backend},
                    info_ttl_s=0, listing_timeout=30)
    await router.model_info(Target(backend, "first", "b"))
    backend.slow = True
    await router.model_info(Target(backend, "first", "b"))  # its refresh runs behind the request's back
    refresh = router._info[("b", "first")].task
    await router.model_info(Target(backend, "second", "b"))  # evicts "first", still asking
    assert ("b", "first") not in router._info and not refresh.done()
    await router.close()
    assert refresh.cancelled()


async def _unknown_model_answers(backends: list[tuple[str, FakeServer]], **config: Any) -> list[tuple[int, Any]]:
    """(status, error) of each generation for a model no backend serves, then of its count in the same dialect."""
    cfg = Config(backends=[BackendConfig(name=f"b{i}", kind=kind, urls=[fake.url])
                           for i, (kind, fake) in enumerate(backends)], cache=CacheConfig(enabled=False), **config)
    chat, anthropic_version = [{"role": "user", "content": "hi"}], {"anthropic-version": "2023-06-01"}
    asked = [("/v1/messages", {"messages": chat, "max_tokens": 8}, anthropic_version),
             ("/v1/messages/count_tokens", {"messages": chat}, anthropic_version),
             ("/v1/responses", {"input": "hi"}, {}), ("/v1/responses/input_tokens", {"input": "hi"}, {})]
    answers = []
    async with TestClient(TestServer(make_app(cfg))) as c:
        for path, body, headers in asked:
            resp = await c.post(path, json={"model": "nope", **body}, headers=headers)
            got = await resp.json()
            answers.append((resp.status, got.get("error", got) if resp.status != 200 else "counted"))
    return answers


async def test_a_count_for_a_model_the_backend_does_not_have_is_generations_404():
    """An Ollama backend (alone, or the default beside another) was asked to generate for a name it does not have
    and answered 404, and the counts of the same request answered 200 with an estimate: Ollama's /api/show, asked
    for the model's window anyway, says so before any answer. An OpenAI-compatible server may serve names it does
    not list (Velo learns only from its refusal to generate): its counts stay an estimate."""
    async with OllamaDouble() as ollama, FakeOpenAI() as openai_api:
        for backends, config in (([("ollama", ollama)], {}),
                                 ([("openai", openai_api), ("ollama", ollama)], {"default_backend": "b1"})):
            messages, count, responses, input_tokens = await _unknown_model_answers(backends, **config)
            assert messages[0] == 404 and messages[1]["type"] == "not_found_error"
            assert responses[0] == 404 and responses[1]["code"] == "model_not_found"
            assert (count, input_tokens) == (messages, responses)  # before: (200, "counted") each
        messages, count, responses, input_tokens = await _unknown_model_answers([("openai", openai_api)])
        assert messages[0] == responses[0] == 404 and count == input_tokens == (200, "counted")


async def test_a_model_the_backend_showed_as_missing_is_looked_up_again_once_pulled():
    """A 404 kept as the model's info would have answered a count 404 for the model pulled since, `info_ttl_s` long."""
    backend = ScriptedBackend("b", ("tiny:latest",))
    backend.shows_every_model = True  # type: ignore[misc]
    router = Router(parse_config({"backends": [{"name": "b", "kind": "ollama", "url": "http://u:1"}]}),
                    {"b": backend}, unknown_ttl_s=0.05)
    target = Target(backend, "new:latest")
    with pytest.raises(ModelNotFound, match="model 'new:latest' not found"):
        await router.served_info(target)
    backend.models.append("new:latest")
    await asyncio.sleep(0.1)  # past the time a listing counts as fresh for unknown names
    assert (await router.served_info(target)).name == "new:latest"
    unlisting = ScriptedBackend("o", ("tiny:latest",))  # may serve what it does not show: the request finds out
    assert await router.served_info(Target(unlisting, "new:latest")) is None
    await router.close()
