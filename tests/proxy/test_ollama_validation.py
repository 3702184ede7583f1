"""Ollama's statuses and words for what it refuses, through the real `ollama` client where it has the route."""
import ollama
import pytest

from proxy.dialects import ollama_names
from tests.scripted import ScriptedBackend

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path, body, status, error", [
    ("/api/generate", {"prompt": "x", "raw": True, "system": "s"}, 400,
     "raw mode does not support template, system, or context"),
    ("/api/generate", {"prompt": "x", "raw": True, "template": "{{ .Prompt }}"}, 400, "raw mode does not support"),
    ("/api/generate", {"prompt": "x", "raw": True, "context": [1]}, 400, "raw mode does not support"),
    ("/api/generate", {"prompt": "x", "keep_alive": "bogus"}, 400, 'time: invalid duration "bogus"'),
    ("/api/chat", {"messages": CHAT, "keep_alive": "10"}, 400, 'time: missing unit in duration "10"'),
    ("/api/embed", {"input": "x", "keep_alive": "bogus"}, 400, "invalid duration"),
    # images are base64 ([]byte in Go's JSON): a web URL was passed on, to be fetched by whatever reads it
    ("/api/generate", {"prompt": "x", "images": ["http://169.254.169.254/latest"]}, 400,
     "illegal base64 data at input byte 4"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["https://example.com/a.png"]}]}, 400,
     "illegal base64 data at input byte 5"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": [7]}]}, 400, "base64 strings"),
    ("/api/chat", {"messages": CHAT, "options": {"num_predict": 1e300}}, 400, "out of range"),  # was a 500
    # api/types.go Options.FromMap's words (Ollama answers them 500); runner options went on unchecked
    ("/api/chat", {"messages": CHAT, "options": {"temperature": "hot"}}, 400,
     'option "temperature" must be of type float32'),
    ("/api/generate", {"prompt": "x", "options": {"num_gpu": "all"}}, 400, 'option "num_gpu" must be of type integer'),
    ("/api/chat", {"messages": CHAT, "options": {"use_mmap": 1}}, 400, 'option "use_mmap" must be of type boolean'),
    ("/api/chat", {"messages": CHAT, "options": {"top_k": True}}, 400, 'option "top_k" must be of type integer'),
    ("/api/chat", {"messages": CHAT, "options": {"stop": [1]}}, 400, 'option "stop" must be of an array of strings'),
    ("/api/embed", {"input": "x", "options": {"num_ctx": "8k"}}, 400, 'option "num_ctx" must be of type integer'),
])
async def test_refused_as_ollama_refuses(client, scripted: ScriptedBackend, path, body, status, error):
    resp = await client.post(path, json={"model": "tiny", "stream": False, **body})
    assert resp.status == status and error in (await resp.json())["error"]
    assert scripted.requests == []


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
@pytest.mark.parametrize("name", ["num_predict", "num_ctx", "seed", "top_k"])
async def test_a_whole_number_option_of_null_is_unset_as_ollama_skips_it(client, scripted, path, name):
    """Ollama's Options.FromMap passes over a null value; an integer option of null was a 500."""
    resp = await client.post(path, json={"model": "tiny", "stream": False, "messages": CHAT, "prompt": "x",
                                         "options": {name: None}})
    assert resp.status == 200 and len(scripted.requests) == 1, await resp.text()


@pytest.mark.parametrize("path, body, status, error", [
    ("/api/generate", {"prompt": "hi"}, 404, "model '' not found"),
    ("/api/generate", {"model": " ", "prompt": "hi"}, 404, "model ' ' not found"),
    ("/api/generate", {}, 404, "model '' not found"),  # a bare load of no model
    ("/api/generate", {"prompt": "x", "raw": True, "system": "s"}, 404, "model '' not found"),  # the model first
    ("/api/chat", {"messages": CHAT}, 400, "model is required"),
    ("/api/chat", {"model": " ", "messages": []}, 400, "model is required"),
    ("/api/embed", {"input": "hi"}, 404, 'model "" not found, try pulling it first'),
    ("/api/embed", {"model": " ", "input": []}, 404, 'model " " not found, try pulling it first'),
    ("/api/embeddings", {"prompt": "hi"}, 400, "model is required"),
])
async def test_a_missing_model_is_refused_as_each_handler_refuses_it(client, scripted, path, body, status, error):
    """server/routes.go: GenerateHandler and EmbedHandler (through handleScheduleError) answer it as a model they
    cannot find (Velo said 400 "model is required"), ChatHandler and EmbeddingsHandler as a bad request."""
    resp = await client.post(path, json=body)
    assert (resp.status, await resp.json()) == (status, {"error": error})
    assert scripted.requests == []


async def test_a_name_outside_ollamas_grammar_that_velo_does_not_serve_is_ollamas_400():
    """Ollama refuses it before any look-up (server/routes.go: its chat, generate, show and embedding handlers;
    types/model/name.go, internal/modelref); it was a 404 here. A name Velo serves stays served, whatever Ollama
    would make of it (a namespace with a dot)."""
    from aiohttp.test_utils import TestClient, TestServer

    from proxy.app import make_app
    from proxy.config import Config
    backends = {"a": ScriptedBackend("a"), "b": ScriptedBackend("b", models=("qwen2.5/coder:latest",))}
    async with TestClient(TestServer(make_app(Config(), backends))) as c:
        for name, status, error in (("bad name!", 400, "invalid model name"), ("a:b:c", 400, "invalid model name"),
                                    ("m:cloud:local", 400, 'use either :local or :cloud, not both: "m:cloud:local"'),
                                    ("nope:1b", 404, "model 'nope:1b' not found")):
            for path, body in (("/api/chat", {"messages": CHAT}), ("/api/chat", {"messages": []}),
                               ("/api/generate", {"prompt": "hi"}), ("/api/generate", {}), ("/api/show", {}),
                               ("/api/embed", {"input": "hi"}), ("/api/embed", {}),
                               ("/api/embeddings", {"prompt": "hi"})):
                resp = await c.post(path, json={"model": name, "stream": False, **body})
                if status == 404 and path.startswith("/api/embed"):  # handleScheduleError's words
                    error = f'model "{name}" not found, try pulling it first'
                assert (resp.status, await resp.json()) == (status, {"error": error})
        for path, body in (("/api/chat", {"messages": CHAT}), ("/api/generate", {"prompt": "hi"})):
            assert (await c.post(path, json={"model": "qwen2.5/coder", "stream": False, **body})).status == 200
    assert [len(b.requests) for b in backends.values()] == [0, 2]


@pytest.mark.parametrize("name, valid", [
    ("qwen2.5-coder:1.5b", True), ("hf.co/bartowski/Qwen-GGUF:Q4_K_M", True), ("localhost:5000/ns/m:t", True),
    ("https://h/ns/m", True), ("gpt-oss:20b:cloud", True), ("llama3:8b-cloud", True), ("m" * 80, True),
    ("m" * 81, False), ("qwen2.5/coder", False), ("a/b/c/d", False), ("/ns/m", False), ("m:", False),
    ("modèle", False), (".m", False), ("/m/qwen.gguf", False), ("m@sha256:abc", False)])
def test_ollamas_name_grammar(name, valid):
    """types/model/name.go: parts of letters, digits, "_", "-" (and "." but in a namespace; ":" in a host), up to 80
    characters (a host 350); internal/modelref takes off a :cloud, :local or -cloud source first."""
    assert ollama_names.valid(name) is valid
    assert ollama_names.refusal(name) == (None if valid else "invalid model name")


@pytest.mark.parametrize("name, quoted", [("modèle:cloud:local", '"modèle:cloud:local"'),
                                          ("m\u200b:cloud:local", '"m\\u200b:cloud:local"'),
                                          ("m\x7f:cloud:local", '"m\\x7f:cloud:local"'),
                                          ('m"\\:cloud:local', '"m\\"\\\\:cloud:local"')])
def test_a_name_in_ollamas_refusal_is_quoted_as_gos_q_quotes_it(name, quoted):
    """strconv.Quote: printable letters as they are, a zero-width space or a DEL escaped."""
    assert ollama_names.refusal(name) == f"use either :local or :cloud, not both: {quoted}"


@pytest.mark.parametrize("name", ["m:cloud:local", "m:7b-cloud:local", "m:local:cloud"])
def test_a_name_with_two_sources_is_ollamas_400_saying_so(name):
    """internal/modelref ParseRef: a source suffix on a name that already has one."""
    assert ollama_names.refusal(name) == f'use either :local or :cloud, not both: "{name}"'


async def test_what_the_model_lacks_is_a_400_with_ollamas_words(base_url, scripted: ScriptedBackend):
    scripted.capabilities = ["completion"]
    c = ollama.AsyncClient(host=base_url)
    for call, feature in ((c.generate(model="tiny", prompt="def f(", suffix="pass", raw=True), "insert"),
                          (c.generate(model="tiny", prompt="what is this", images=[b"\x89PNG"]), "vision"),
                          (c.chat(model="tiny", messages=CHAT, think=True), "thinking")):
        with pytest.raises(ollama.ResponseError) as e:
            await call
        assert (e.value.status_code, e.value.error) == (400, f'"tiny" does not support {feature}')
    assert scripted.requests == []
    # an empty suffix asks no insert, as Ollama reads it (Tabby and Void send "" at the end of a file)
    assert (await c.generate(model="tiny", prompt="def f(", suffix="", raw=True)).response
    oai = await c._client.post("/v1/completions", json={"model": "tiny", "prompt": "def f(", "suffix": ""})
    assert oai.status_code == 200 and [r.suffix for r in scripted.requests] == [None, None]


@pytest.mark.parametrize("name, shown", [("tiny", "tiny:latest"), ("tiny:1b", "tiny:1b"),
                                         ("registry.ollama.ai/library/tiny:1b", "tiny:1b"),
                                         ("user/tiny", "user/tiny:latest"), ("hf.co/u/tiny:Q4", "hf.co/u/tiny:Q4")])
async def test_unknown_model_is_ollamas_404_naming_it_as_show_names_it(base_url, scripted: ScriptedBackend, name,
                                                                        shown):
    """ShowHandler names the model by DisplayShortest (server/routes.go, types/model/name.go): a tag always, Ollama's
    default host and namespace never; Velo named it as written (`model 'tiny' not found`)."""
    scripted.models = ["other:latest"]
    c = ollama.AsyncClient(host=base_url)
    with pytest.raises(ollama.ResponseError) as e:
        await c.show(name)
    assert (e.value.status_code, e.value.error) == (404, f"model '{shown}' not found")


async def test_a_keep_alive_past_gos_longest_duration_is_for_good(client, scripted: ScriptedBackend):
    """1e300 seconds made every later /api/ps a 500: its expiry date could not be written."""
    from adapters import keep_alive
    assert keep_alive.seconds(1e300) == keep_alive.FOREVER and keep_alive.seconds(3600) == 3600
    scripted.idle_unload = True
    resp = await client.post("/api/chat", json={"model": "tiny", "stream": False, "messages": CHAT,
                                                "keep_alive": 1e300})
    assert resp.status == 200
    ps = await client.get("/api/ps")
    assert ps.status == 200 and (await ps.json())["models"]


async def test_a_missing_embedding_model_is_ollamas_404_that_says_to_pull_it():
    """EmbedHandler and EmbeddingsHandler answer it through handleScheduleError (server/routes.go), in other words
    than the chat handler's, which embedding clients match to tell the user to pull the model; Velo said
    `model 'nope' not found` on both."""
    from aiohttp.test_utils import TestClient, TestServer

    from proxy.app import make_app
    from proxy.config import Config
    backends = {"a": ScriptedBackend("a"), "b": ScriptedBackend("b", models=("other:latest",))}
    async with TestClient(TestServer(make_app(Config(), backends))) as c:
        oll = ollama.AsyncClient(host=str(c.make_url("")).rstrip("/"))
        for call in (oll.embed(model="nope", input="hi"), oll.embeddings(model="nope", prompt="hi")):
            with pytest.raises(ollama.ResponseError) as e:
                await call
            assert (e.value.status_code, e.value.error) == (404, 'model "nope" not found, try pulling it first')
        with pytest.raises(ollama.ResponseError) as e:
            await oll.chat(model="nope", messages=CHAT)
        assert (e.value.status_code, e.value.error) == (404, "model 'nope' not found")


@pytest.mark.parametrize("name", ["TINY", "Tiny:Latest", "library/tiny", "registry.ollama.ai/library/tiny:latest",
                                  "https://Registry.Ollama.AI/Library/tiny"])
async def test_a_model_is_found_under_any_name_ollama_takes_for_it(name):
    """Ollama matches each part of a name in any case (server/routes.go getExistingName) and fills in its default
    host, namespace and tag (types/model/name.go ParseName); Velo answered these a 404 where Ollama answers."""
    from aiohttp.test_utils import TestClient, TestServer

    from proxy.app import make_app
    from proxy.config import Config
    backends = {"a": ScriptedBackend("a"), "b": ScriptedBackend("b", models=("other:1b",))}
    async with TestClient(TestServer(make_app(Config(), backends))) as c:
        oll = ollama.AsyncClient(host=str(c.make_url("")).rstrip("/"))
        answer = await oll.chat(model=name, messages=CHAT)
        assert answer.model == name and answer.message.content == "Hello world"
        assert (await oll.show(name)).details.family == "llama"
        with pytest.raises(ollama.ResponseError) as e:
            await oll.chat(model="user/tiny", messages=CHAT)  # another namespace is another model
        assert e.value.status_code == 404
    assert [r.model for r in backends["a"].requests] == ["tiny:latest"] and backends["b"].requests == []



@pytest.mark.parametrize("think, error", [
    ("loud", 'invalid think value: "loud" (must be "high", "medium", "low", "max", true, or false)'),
    (3, 'think must be a boolean or string ("high", "medium", "low", "max", true, or false)')])
async def test_a_think_ollama_cannot_read_is_its_400_in_its_words(client, scripted, think, error):
    """api/types.go ThinkValue.UnmarshalJSON, whose error the handlers answer as it is; Velo worded it its own way."""
    for path in ("/api/chat", "/api/generate"):
        resp = await client.post(path, json={"model": "tiny", "messages": CHAT, "prompt": "x", "think": think})
        assert (resp.status, await resp.json()) == (400, {"error": error})
    assert scripted.requests == []



@pytest.mark.parametrize("name", [" tiny", "tiny\n", "tiny:local", "TINY:Local", "tiny:latest:local"])
async def test_spaces_around_a_name_and_its_local_source_are_no_part_of_it(name):
    """internal/modelref ParseRef trims the name and takes a `:local` suffix off it (it asks for the model on this
    server); Velo answered a 404, and /api/show `tiny:local` said `model 'tiny:latest' not found` of a model it lists.
    `:cloud` stays a model Velo does not have."""
    from aiohttp.test_utils import TestClient, TestServer

    from proxy.app import make_app
    from proxy.config import Config
    backends = {"a": ScriptedBackend("a"), "b": ScriptedBackend("b", models=("other:1b",))}
    async with TestClient(TestServer(make_app(Config(), backends))) as c:
        oll = ollama.AsyncClient(host=str(c.make_url("")).rstrip("/"))
        assert (await oll.chat(model=name, messages=CHAT)).message.content == "Hello world"
        assert (await oll.show(name)).details.family == "llama"
        with pytest.raises(ollama.ResponseError) as e:
            await oll.chat(model="tiny:cloud", messages=CHAT)
        assert e.value.status_code == 404
    assert [r.model for r in backends["a"].requests] == ["tiny:latest"]
