"""The call-backend stage's collector: what a backend says of itself on /metrics (Velo's engine)."""
from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from adapters.base import BackendConfig
from adapters.engine import EngineBackend
from proxy.app import make_app
from proxy.config import Config
from tests.engine.tiny import engine_options, write_tiny_model
from tests.proxy.test_metrics import samples, value
from tests.scripted import ScriptedBackend


async def test_the_engines_batch_kv_cache_and_tokens_are_on_metrics(tmp_path):
    """They were only in LLMEngine.metrics(), which nothing outside Velo's process could read."""
    engine = EngineBackend(BackendConfig(name="engine", kind="engine",
                                         options=engine_options(write_tiny_model(str(tmp_path), "qwen2"))))
    wire = ScriptedBackend("wire", models=("other",))
    async with TestClient(TestServer(make_app(Config(default_backend="engine"),
                                              {"engine": engine, "wire": wire}))) as c:
        answered = await c.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0})
        assert answered.status == 200
        for _ in range(500):  # the engine's snapshot follows the step after the answer's last token
            found = samples(await (await c.get("/metrics")).text())
            if value(found, "velo_engine_running", backend="engine") == 0:
                break
            await asyncio.sleep(0.01)
        figures = engine.figures()
    engine_label = {"backend": "engine"}
    assert value(found, "velo_engine_generated_tokens_total", **engine_label) == figures["generated_tokens"] > 0
    assert value(found, "velo_engine_prompt_tokens_total", **engine_label) == figures["prompt_tokens"] > 0
    assert value(found, "velo_engine_kv_blocks", **engine_label) == figures["kv_blocks_total"] > 0
    assert value(found, "velo_engine_running", **engine_label) == 0
    assert not any(dict(labels).get("backend") == "wire" for name, labels in found if name.startswith("velo_engine"))
