"""/api/create, /api/copy and /api/delete through the official `ollama` client, and preset names used from the
`openai` client: presets listed, applied, copied, deleted, kept across a restart, and Ollama's errors."""
from __future__ import annotations

import os
import stat

import aiohttp
import ollama
import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.protocol import ModelInfo
from proxy.app import make_app
from proxy.config import Config
from proxy.presets import PresetsConfig
from tests.scripted import ScriptedBackend

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def config(tmp_path) -> Config:
    return Config(presets=PresetsConfig(path=str(tmp_path / "velo" / "presets.json")))


@pytest.fixture
def oll(base_url: str) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=base_url)


async def names(oll: ollama.AsyncClient) -> set[str]:
    return {m.model for m in (await oll.list()).models}


async def test_create_lists_and_applies_a_preset(oll, base_url, scripted: ScriptedBackend):
    statuses = [s.status async for s in await oll.create(
        "mario", from_="tiny", system="You are Mario.", parameters={"temperature": 0.2, "stop": ["END"]},
        stream=True)]
    assert statuses == ["writing manifest", "success"]
    listed = {m.model: m for m in (await oll.list()).models}
    assert set(listed) == {"tiny:latest", "mario:latest"} and listed["mario:latest"].details.family == "llama"
    shown = await oll.show("mario")
    assert shown.details.family == "llama"  # its base model's, with its own system prompt, parameters and time
    assert 'SYSTEM """You are Mario."""' in shown.modelfile and "PARAMETER temperature" in shown.modelfile
    assert "temperature                    0.2" in shown.parameters
    assert 'stop                           "END"' in shown.parameters
    assert shown.modified_at > (await oll.show("tiny")).modified_at
    async with aiohttp.ClientSession() as http:  # the package's ShowResponse has no `system`; Ollama's API does
        for model, system in (("mario", "You are Mario."), ("tiny", None)):
            async with http.post(f"{base_url}/api/show", json={"model": model}) as resp:
                assert (await resp.json()).get("system") == system

    await oll.chat("mario", messages=USER)
    req = scripted.requests[-1]
    assert req.model == "tiny:latest" and [(m.role, m.content) for m in req.messages] == [
        ("system", "You are Mario."), ("user", "hi")]
    assert (req.options.temperature, req.options.stop, req.options.top_k) == (0.2, ["END"], 40)

    oai = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="k", max_retries=0)
    assert "mario:latest" in {m.id async for m in oai.models.list()}
    await oai.chat.completions.create(model="mario", messages=USER)
    req = scripted.requests[-1]
    assert req.messages[0].content == "You are Mario."
    assert (req.options.temperature, req.options.top_p, req.options.top_k) == (0.2, 1.0, None)  # OpenAI's defaults


async def test_copy_and_delete(oll, scripted: ScriptedBackend):
    await oll.create("mario", from_="tiny", system="You are Mario.")
    assert (await oll.copy("mario", "luigi")).status == "success"
    assert await names(oll) == {"tiny:latest", "mario:latest", "luigi:latest"}
    await oll.chat("luigi", messages=USER)
    assert scripted.requests[-1].messages[0].content == "You are Mario."

    await oll.delete("mario")
    assert await names(oll) == {"tiny:latest", "luigi:latest"}
    with pytest.raises(ollama.ResponseError) as missing:
        await oll.delete("mario")
    assert missing.value.status_code == 404 and "mario" in missing.value.error

    with pytest.raises(ollama.ResponseError) as invalid:  # Ollama's 400 (CopyHandler), not a 404
        await oll.copy("bad name", "x")
    assert invalid.value.status_code == 400 and invalid.value.error == 'source "bad name" is invalid'

    await oll.copy("tiny", "tiny-2")  # a backend's model under a new name: a preset with nothing to add
    await oll.chat("tiny-2", messages=USER)
    assert scripted.requests[-1].model == "tiny:latest" and scripted.requests[-1].messages[0].role == "user"


async def test_names_as_ollama_writes_them(oll):
    for name in ("library/mario:v1.2", "me/mario", "mario_2.5-x", "localhost:11434/me/m" + "x" * 79):
        await oll.create(name, from_="tiny")
    assert await names(oll) == {"tiny:latest", "library/mario:v1.2", "me/mario:latest", "mario_2.5-x:latest",
                                "localhost:11434/me/m" + "x" * 79 + ":latest"}


async def test_a_name_in_another_case_is_the_same_model(oll, scripted: ScriptedBackend):
    """Ollama matches names whatever their case (getExistingName): "P1" made a second model beside "p1"."""
    await oll.create("p1", from_="tiny", system="first")
    await oll.create("P1", from_="tiny", system="second")
    assert await names(oll) == {"tiny:latest", "p1:latest"}
    await oll.chat("P1", messages=USER)
    assert scripted.requests[-1].messages[0].content == "second"


async def test_openai_finds_a_preset_by_either_spelling(oll, base_url):
    await oll.create("p1", from_="tiny")
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    assert (await client.models.retrieve("p1")).id == (await client.models.retrieve("p1:latest")).id == "p1:latest"


async def test_a_preset_from_a_preset_folds_into_one(oll, scripted: ScriptedBackend):
    await oll.create("mario", from_="tiny", system="You are Mario.", parameters={"temperature": 0.2, "top_k": 3})
    await oll.create("mario-hot", from_="mario", parameters={"temperature": 1.5})
    await oll.delete("mario")
    await oll.chat("mario-hot", messages=USER)
    req = scripted.requests[-1]
    assert req.model == "tiny:latest" and req.messages[0].content == "You are Mario."
    assert (req.options.temperature, req.options.top_k) == (1.5, 3)


async def test_presets_are_kept_across_a_restart_in_a_private_file(oll, config: Config):
    await oll.create("mario", from_="tiny", system="You are Mario.")
    path = config.presets.file()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and not path.with_name(path.name + ".tmp").exists()
    backend = ScriptedBackend()
    async with TestClient(TestServer(make_app(config, {"s": backend}))) as again:
        tags = await (await again.get("/api/tags")).json()
        assert {m["name"] for m in tags["models"]} == {"tiny:latest", "mario:latest"}
        await again.post("/api/chat", json={"model": "mario", "messages": USER, "stream": False})
        assert backend.requests[-1].messages[0].content == "You are Mario."


@pytest.mark.parametrize("call, status, words", [
    (lambda c: c.create("x", from_="nope"), 404, "nope"),
    (lambda c: c.copy("nope", "x"), 404, "nope"),
    (lambda c: c.create("x"), 400, "'from'"),
    (lambda c: c.create("x", from_="tiny", parameters={"temperature": "hot"}), 400, "temperature"),
    (lambda c: c.create("x", files={"m.gguf": "sha256:00"}), 400, "Ollama backend"),
    (lambda c: c.delete("tiny"), 400, "only presets"),
    (lambda c: c.create("no spaces please", from_="tiny"), 400, "invalid model name"),
    (lambda c: c.copy("tiny", "a?b"), 400, 'destination "a?b" is invalid'),
    # Ollama's parts are ASCII and at most 80 characters: a 2,000-character name was listed and no request could use it
    (lambda c: c.create("modèle", from_="tiny"), 400, "invalid model name"),
    (lambda c: c.create("m" * 81, from_="tiny"), 400, "invalid model name"),
    (lambda c: c.create("m:" + "t" * 81, from_="tiny"), 400, "invalid model name"),
    (lambda c: c.delete("bad name!"), 400, 'name "bad name!" is invalid'),  # DeleteHandler's words
])
async def test_errors_in_ollamas_shape(oll, call, status, words):
    with pytest.raises(ollama.ResponseError) as err:
        await call(oll)
    assert err.value.status_code == status and words in err.value.error
    assert await names(oll) == {"tiny:latest"}


@pytest.mark.parametrize("source, destination, status, error", [
    ("nope", "x", 404, 'model "nope" not found'), ("tiny", "a?b", 400, 'destination "a?b" is invalid')])
async def test_copy_refuses_in_the_words_of_ollamas_copy_handler(oll, source, destination, status, error):
    """CopyHandler (server/routes.go) quotes a missing source with %q, and names a bad destination as one; Velo said
    `model 'nope' not found` and `invalid model name "a?b": ...`."""
    with pytest.raises(ollama.ResponseError) as err:
        await oll.copy(source, destination)
    assert (err.value.status_code, err.value.error) == (status, error)


async def test_a_bad_presets_file_stops_the_start_rather_than_being_overwritten(config: Config):
    path = config.presets.file()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a presets file"):
        async with TestClient(TestServer(make_app(config, {"s": ScriptedBackend()}))):
            pass
    assert path.read_text() == "{not json"


class OneCard(ScriptedBackend):
    """Hands out its one card object, as the engine does once its model is unloaded (adapters/engine.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.card: ModelInfo | None = None

    async def list_models(self) -> list[ModelInfo]:
        if self.card is None:
            [self.card] = await super().list_models()
        return [self.card]


@pytest.mark.parametrize("scripted", [OneCard()])
async def test_showing_a_copy_leaves_the_models_own_name(oll, scripted: OneCard):
    """`ollama stop` and `ollama rm` show the name first: the copy's name stuck to the engine's card, and the model
    itself left /api/tags."""
    await oll.copy("tiny", "mycopy")
    assert (await oll.show("mycopy")).details.family == "llama"
    assert await names(oll) == {"tiny:latest", "mycopy:latest"}


async def test_show_applies_the_requests_own_system_and_options(oll, base_url):
    """`ollama run`'s /show modelfile sends the session's /set system and /set parameter along, as Ollama shows them
    in its Modelfile; `parameters` stay the model's own, which /show parameters prints as "Model defined" before the
    session's (Ollama's ShowHandler lists them before it applies the request's options: a /set temperature was
    printed under both)."""
    await oll.create("warm", from_="tiny", parameters={"top_k": 7})
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base_url}/api/show", json={"model": "warm", "system": "Talk like a pirate.",
                                                           "options": {"temperature": 0.3}}) as resp:
            shown = await resp.json()
        async with http.post(f"{base_url}/api/show", json={"model": "tiny"}) as resp:
            plain = await resp.json()
    assert shown["system"] == "Talk like a pirate." and 'SYSTEM """Talk like a pirate."""' in shown["modelfile"]
    assert "PARAMETER temperature" in shown["modelfile"] and "PARAMETER top_k" in shown["modelfile"]
    assert shown["parameters"] == "top_k                          7"
    assert "system" not in plain and "temperature" not in plain.get("parameters", "")


async def test_a_preset_with_messages_continues_their_conversation(oll, base_url, scripted: ScriptedBackend):
    """`ollama run`'s /save sends the session's messages: Ollama keeps them and every chat continues them (a 400
    ended the CLI's session). /api/show gives them back, which `ollama run` prints before its prompt."""
    said = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada!"}]
    await oll.create("saved", from_="tiny", system="Be brief.", messages=said)
    async with aiohttp.ClientSession() as http:  # the ollama package's ShowResponse has no `messages`
        async with http.post(f"{base_url}/api/show", json={"model": "saved"}) as resp:
            assert (await resp.json())["messages"] == said
    await oll.chat(model="saved", messages=[{"role": "user", "content": "My name?"}])
    assert [(m.role, m.content) for m in scripted.requests[-1].messages] == [
        ("system", "Be brief."), ("user", "My name is Ada."), ("assistant", "Hello Ada!"), ("user", "My name?")]
    with pytest.raises(ollama.ResponseError) as e:
        await oll.create("broken", from_="tiny", messages=[{"content": "no role"}])
    assert e.value.status_code == 400


async def test_with_admin_keys_only_those_manage_models(tmp_path):
    """A preset is what every key gets under its name, a backend's model's name included: any key could create one
    over `tiny` with its own system prompt for everyone (or read and delete another's)."""
    from proxy.config import ServerConfig
    config = Config(server=ServerConfig(api_keys=["sk-alice"], admin_keys=["sk-root"]),
                    presets=PresetsConfig(path=str(tmp_path / "presets.json")))
    alice, root = {"Authorization": "Bearer sk-alice"}, {"Authorization": "Bearer sk-root"}
    scripted = ScriptedBackend()
    async with TestClient(TestServer(make_app(config, {"s": scripted}))) as c:
        preset = {"model": "tiny", "from": "tiny", "system": "Be brief."}
        for method, path, body in (("POST", "/api/create", preset), ("POST", "/api/copy", {"source": "tiny",
                                   "destination": "x"}), ("DELETE", "/api/delete", {"model": "tiny"}),
                                   ("POST", "/api/pull", {"model": "tiny"}), ("POST", "/api/push", {"model": "tiny"}),
                                   ("HEAD", "/api/blobs/sha256:00", None)):
            resp = await c.request(method, path, json=body, headers=alice)
            assert resp.status == 403, path
        assert (await c.post("/api/create", json=preset, headers=root)).status == 200
        await c.post("/api/chat", json={"model": "tiny", "messages": USER, "stream": False}, headers=alice)
        assert scripted.requests[-1].messages[0].content == "Be brief."  # an admin's preset serves every key
        assert (await c.delete("/api/delete", json={"model": "tiny"}, headers=root)).status == 200


async def test_with_an_ollama_backend_a_preset_is_velos_own(tmp_path):
    """Over Ollama's own models (the protocol double, field for field): a preset named as one of them is what that
    name serves, so it is what is listed (the real model's digest was); deleting a preset's base is refused (the
    preset was left listed, each chat a 404 naming the base); a preset's pull is Velo's (Ollama's registry was asked
    for it, and the double made a model of that name)."""
    from adapters.base import BackendConfig
    from tests.fakes import OllamaDouble
    async with OllamaDouble(models=["llama3:latest", "all-minilm:latest"]) as up:
        config = Config(backends=[BackendConfig(name="o", kind="ollama", urls=[up.url])], default_backend="o",
                        presets=PresetsConfig(path=str(tmp_path / "presets.json")))
        async with TestClient(TestServer(make_app(config))) as c:
            oll = ollama.AsyncClient(host=str(c.make_url("")).rstrip("/"))
            real = {m.model: m.digest for m in (await oll.list()).models}["all-minilm:latest"]
            await oll.create("all-minilm", from_="llama3", system="SHADOW")
            listed = [m for m in (await oll.list()).models if m.model.startswith("all-minilm")]
            assert len(listed) == 1 and listed[0].digest != real
            await oll.delete("all-minilm")
            await oll.create("ALL-MINILM", from_="llama3", system="SHADOW")  # names match whatever their case
            listed = [m for m in (await oll.list()).models if m.model.casefold().startswith("all-minilm")]
            assert [m.model for m in listed] == ["ALL-MINILM:latest"]
            with pytest.raises(ollama.ResponseError) as refused:
                await oll.delete("llama3")
            assert refused.value.status_code == 400 and "base of ALL-MINILM:latest" in refused.value.error
            assert "llama3:latest" in up.models
            before = set(up.models)
            assert (await oll.pull("all-minilm")).status == "success"
            assert set(up.models) == before and not [r for r in up.requests if r.path == "/api/pull"]


async def test_show_gives_an_ollama_models_own_system_prompt(tmp_path):
    """A model made on Ollama with a SYSTEM (`ollama create` there) lost it through Velo: no `system` and no SYSTEM
    line in /api/show (`ollama show --system`, `--modelfile`), though Ollama applies it to every chat; a preset over
    it without a system prompt of its own, whose chats Ollama answers with it too, showed none either."""
    from adapters.base import BackendConfig
    from tests.fakes import OllamaDouble
    async with OllamaDouble(models=["llama3:latest"]) as up:
        up.models["llama3:latest"].system = "You are a llama."
        config = Config(backends=[BackendConfig(name="o", kind="ollama", urls=[up.url])], default_backend="o",
                        presets=PresetsConfig(path=str(tmp_path / "presets.json")))
        async with TestClient(TestServer(make_app(config))) as c:
            oll = ollama.AsyncClient(host=str(c.make_url("")).rstrip("/"))
            await oll.create("warm", from_="llama3", parameters={"temperature": 0.9})
            await oll.create("pirate", from_="llama3", system="Arr.")
            for model, system in (("llama3", "You are a llama."), ("warm", "You are a llama."), ("pirate", "Arr.")):
                shown = await (await c.post("/api/show", json={"model": model})).json()
                assert shown.get("system") == system and f'SYSTEM """{system}"""' in shown["modelfile"], model


async def test_a_preset_an_earlier_velo_let_through_can_still_be_deleted(oll, config: Config):
    """Names now follow Ollama's rules, but a preset made before (a non-ASCII name) was listed and could not go."""
    import orjson
    path = config.presets.file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"presets": [{"name": "café:latest", "base": "tiny"}]}))
    backend = ScriptedBackend()
    async with TestClient(TestServer(make_app(config, {"s": backend}))) as c:
        assert (await c.delete("/api/delete", json={"model": "café"})).status == 200
        assert "café:latest" not in {m["name"] for m in (await (await c.get("/api/tags")).json())["models"]}
