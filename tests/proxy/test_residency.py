"""How long models stay loaded: keep_alive per request, /api/ps's expires_at, unloading when it runs out."""
import asyncio
import time
from datetime import datetime

import ollama

from adapters.protocol import RunningModel
from proxy.residency import Residency
from proxy.router import Target
from tests.scripted import ScriptedBackend


class Unloadable(ScriptedBackend):
    """A backend whose model Velo loads and unloads itself, as the engine's."""

    idle_unload = True

    def __init__(self) -> None:
        super().__init__()
        self.loaded, self.unloads = True, 0

    async def load(self, model, keep_alive):
        self.loaded = True
        return 1234

    async def unload(self, model):
        self.loaded, self.unloads = False, self.unloads + 1

    async def running(self):
        return [RunningModel(name="tiny:latest")] if self.loaded else []


async def test_expires_after_the_last_requests_keep_alive_and_not_while_in_flight():
    backend, residency = Unloadable(), Residency()
    target = Target(backend, "tiny:latest")
    await residency.start()
    try:
        with residency.use(target, "0.2s"):
            await asyncio.sleep(0.4)  # in flight: never unloaded under a request
            assert backend.unloads == 0 and residency.expires_at("scripted", "tiny:latest").startswith("2")
        with residency.use(target, "1h"):
            pass
        expires = datetime.fromisoformat(residency.expires_at("scripted", "tiny:latest")).timestamp()
        assert 3590 < expires - time.time() <= 3600
        with residency.use(target, 0.1):
            pass
        for _ in range(50):
            await asyncio.sleep(0.05)
            if backend.unloads:
                break
        assert backend.unloads == 1 and residency.expires_at("scripted", "tiny:latest") is None
        with residency.use(target, -1):
            pass
        assert residency.expires_at("scripted", "tiny:latest") > "2300"  # kept for good, as Ollama writes it
    finally:
        await residency.close()


async def test_keep_alive_zero_waits_for_requests_in_flight():
    backend, residency = Unloadable(), Residency()
    target = Target(backend, "tiny:latest")
    await residency.start()
    try:
        with residency.use(target, None):
            with residency.use(target, "5m"):
                await residency.unload(target)
                assert backend.unloads == 0
            await asyncio.sleep(0.2)
            assert backend.unloads == 0  # one request still runs
        for _ in range(50):
            await asyncio.sleep(0.02)
            if backend.unloads:
                break
        assert backend.unloads == 1  # once the last is done, whatever keep_alive they sent
        with residency.use(target, "5m"):
            pass
        await asyncio.sleep(0.2)
        assert backend.unloads == 1
        await residency.unload(target)
        assert backend.unloads == 2
        assert await residency.load(target, None) == 1234 and backend.loaded
    finally:
        await residency.close()


async def test_ps_load_and_unload_through_the_ollama_client(base_url, scripted: ScriptedBackend):
    c = ollama.AsyncClient(host=base_url)
    [running] = (await c.ps()).models
    assert running.context_length == 8192  # always sent, as Ollama >= 0.12.6 does
    await c.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], keep_alive="10m")
    [running] = (await c.ps()).models
    assert running.expires_at.year > 2300  # a backend that keeps its model (not Velo's to unload) says so
    loaded = await c.chat(model="tiny", messages=[])
    assert loaded.done and loaded.done_reason == "load"
    unloaded = await c.chat(model="tiny", messages=[], keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert (await c.generate(model="tiny", prompt="", keep_alive="0s")).done_reason == "unload"
    assert (await c.generate(model="tiny", prompt="")).done_reason == "load"
    assert len(scripted.requests) == 1  # loading and unloading generate nothing


async def test_a_stay_ended_while_the_timer_awaited_is_not_ended_again_under_a_new_request():
    """The timer unloads the expired models one after another; while it awaited the first, a `keep_alive: 0` ended
    the second's stay and a request began a new one under the same name. The timer's old view must not end that."""
    class Slow(Unloadable):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()

        async def unload(self, model):
            if model == "a":
                await self.release.wait()
            await super().unload(model)

    backend, residency = Slow(), Residency()
    first, second = Target(backend, "a"), Target(backend, "b")
    for target in (first, second):
        with residency.use(target, 0.05):
            pass
    await residency.start()
    try:
        await asyncio.sleep(0.2)  # both expired; the timer waits on a's unload
        await residency.unload(second)
        assert backend.unloads == 1
        with residency.use(second, "1h"):
            backend.release.set()
            await asyncio.sleep(0.2)
            assert backend.unloads == 2 and residency.expires_at("scripted", "b") is not None
    finally:
        await residency.close()


async def test_a_backend_that_unloads_for_itself_keeps_no_stay_once_its_requests_are_done():
    """Every name a client made up stayed (a backend that answers any name, or a request refused after this stage):
    1,000 names, 1,000 entries, and a 100 KB name pinned 100 KB."""
    residency = Residency()
    for n in range(1000):
        with residency.use(Target(ScriptedBackend(), f"made-up-{n}"), None):
            assert len(residency.stays) == 1
    assert residency.stays == {}
    engine_like = Target(Unloadable(), "tiny:latest")
    with residency.use(engine_like, "1h"):
        pass
    assert list(residency.stays) == [("scripted", "tiny:latest")]  # its unload is Velo's: when, it keeps


async def test_stays_outlive_a_config_reload():
    """Each configuration had its own: after a reload an engine's model was never unloaded when its keep_alive ran
    out, /api/ps lost its expiry, and `keep_alive: 0` on the new one unloaded it under a request still running on
    the old one."""
    import tempfile

    from proxy.config import Config
    from proxy.generation import Generation, Generations
    from proxy.keep import Keep
    config = Config()
    config.presets.path = tempfile.mktemp()
    keep, backend = Keep(), Unloadable()
    first = Generation.build(1, config, keep, {"s": backend})
    await first.start()
    generations = Generations(first)
    target = await first.router.resolve("tiny")
    running = first.pipeline.residency.use(target, "10m")
    running.__enter__()  # a request on the first configuration, still running
    second = Generation.build(2, config, keep, {"s": backend})
    await second.start()
    generations.swap(second)
    assert second.pipeline.residency is first.pipeline.residency
    await second.pipeline.residency.unload(target)  # keep_alive 0 on the new configuration
    assert backend.unloads == 0  # not under the running request
    running.__exit__(None, None, None)
    with second.pipeline.residency.use(target, "0.3s"):
        pass
    assert second.pipeline.residency.expires_at(target.backend.name, target.model) is not None  # /api/ps shows it
    await asyncio.gather(*generations.retiring)
    for _ in range(100):
        if backend.unloads:
            break
        await asyncio.sleep(0.02)
    assert backend.unloads == 1  # its keep_alive ran out after the first configuration retired
    await generations.close()


async def test_a_model_loaded_at_start_stays_its_backends_keep_alive_and_no_longer():
    """The engine loads its model when Velo starts; with no request yet it had no stay, so /api/ps said "kept
    forever" and the model (its KV memory: half a GPU by default) stayed loaded until a request came and went."""
    import tempfile

    from proxy.config import Config
    from proxy.generation import Generation
    from proxy.keep import Keep
    config = Config()
    config.presets.path = tempfile.mktemp()
    backend = Unloadable()
    backend.default_keep_alive = "0.3s"
    generation = Generation.build(1, config, Keep(), {"s": backend})
    await generation.start()
    try:
        expires = generation.pipeline.residency.expires_at("scripted", "tiny:latest")
        assert expires is not None and datetime.fromisoformat(expires).timestamp() - time.time() <= 0.3
        for _ in range(100):
            if backend.unloads:
                break
            await asyncio.sleep(0.02)
        assert backend.unloads == 1 and not backend.loaded
    finally:
        await generation.close()


async def test_a_backend_a_reload_opens_anew_gets_its_own_stay():
    """A reload that changes an engine's table opens a new engine under the same name, which loads its model; the
    stay the old one's requests left named the old backend, so the new model stayed loaded for good."""
    import tempfile

    from proxy.config import Config
    from proxy.generation import Generation, Generations
    from proxy.keep import Keep
    config = Config()
    config.presets.path = tempfile.mktemp()
    keep, old, new = Keep(), Unloadable(), Unloadable()
    first = Generation.build(1, config, keep, {"s": old})
    await first.start()
    generations = Generations(first)
    with first.pipeline.residency.use(await first.router.resolve("tiny"), "1h"):
        pass
    new.default_keep_alive, new.config.urls = "0.3s", ["http://scripted/changed"]  # a changed table: opened anew
    second = Generation.build(2, config, keep, {"s": new})
    assert second.backends["s"] is new
    await second.start()
    generations.swap(second)
    try:
        for _ in range(100):
            if new.unloads:
                break
            await asyncio.sleep(0.02)
        assert new.unloads == 1
    finally:
        await generations.close()
