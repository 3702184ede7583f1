from __future__ import annotations

import pytest

from adapters.errors import ModelNotFound
from proxy.config import parse_config
from proxy.router import Router
from tests.scripted import ScriptedBackend


def _router(**extra) -> tuple[Router, ScriptedBackend, ScriptedBackend]:
    cfg = parse_config({"backends": [{"name": "a", "kind": "ollama", "url": "u"},
                                     {"name": "b", "kind": "llamacpp", "url": "v"}], **extra})
    a, b = ScriptedBackend("a", ("llama3:latest", "shared:latest")), ScriptedBackend("b", ("qwen-coder", "shared:latest"))
    return Router(cfg, {"a": a, "b": b}), a, b


async def test_listing_is_the_union_and_first_backend_wins_duplicates():
    router, *_ = _router()
    listed = {m.name: m.backend for m in await router.list_models()}
    assert listed == {"llama3:latest": "a", "shared:latest": "a", "qwen-coder": "b"}


async def test_resolution_order_alias_exact_glob_listing_default():
    router, a, b = _router(routes=[{"match": "qwen*", "backend": "b"}, {"match": "special", "backend": "b",
                                                                       "model": "renamed"}],
                           aliases={"gpt-4o": "b:qwen-coder", "fast": "llama3"}, default_backend="a")
    assert (t := await router.resolve("gpt-4o")).backend is b and t.model == "qwen-coder"
    assert (await router.resolve("special")).model == "renamed"
    assert (await router.resolve("qwen2.5")).backend is b
    assert (t := await router.resolve("llama3")).backend is a and t.model == "llama3:latest"
    assert (await router.resolve("fast")).model == "llama3:latest"
    assert (await router.resolve("unknown-model")).backend is a  # the default takes the rest


async def test_unknown_model_without_default_is_404():
    router, *_ = _router()
    with pytest.raises(ModelNotFound, match='model "nope" not found'):
        await router.resolve("nope")


async def test_a_down_backend_does_not_hide_the_others():
    router, a, _ = _router()

    async def broken():
        raise ConnectionError("down")
    a.list_models = broken  # type: ignore[method-assign]
    assert [m.name for m in await router.list_models()] == ["qwen-coder", "shared:latest"]


async def test_aliases_are_listed():
    router, *_ = _router(aliases={"gpt-4o": "b:qwen-coder"})
    assert "gpt-4o" in {m.name for m in await router.list_models()}
