"""The new user's path: `velo serve` with no config and no Ollama starts the embedded engine on the shipped
SmolLM2-135M, and the real `openai` and `ollama` clients chat with it. Structured output and tool calls come
from the engine's grammar-constrained decoding (no repair needed), so they must always validate."""
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import aiohttp
import jsonschema
import pytest

from engine.default_model import default_model_path
from engine.loader import gguf_tokenizer
from tests.http_ready import wait_until_ok
from tests.integration.conftest import clients
from tests.llama_server import free_port

ROOT = str(Path(__file__).resolve().parents[2])
MODEL = "smollm2:135m"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 30},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def velo_default(tmp_path_factory) -> Iterator[str]:
    """`velo serve` in an empty folder (no config.toml, no $VELO_CONFIG), as the README's first command runs it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VELO_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])  # this checkout, however Velo is installed
    env["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("data"))  # a fresh machine's: no presets made before
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", str(port)],
                            cwd=tmp_path_factory.mktemp("fresh"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_until_ok(url + "/api/tags", 180, proc=proc))
        yield url
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out  # SIGTERM is a graceful shutdown


async def test_lists_and_chats_with_the_shipped_model(velo_default):
    oai, oll = clients(velo_default)
    assert [m.model for m in (await oll.list()).models] == [MODEL]
    assert [m.id async for m in oai.models.list()] == [MODEL]
    # "Answer in one sentence.": without it the shipped model's first token is a near-tie ("The" 0.152 against
    # "L" 0.140 in float32), which bf16 kernels of some CPUs break the other way, into a French ramble
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    whole = await oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0)
    assert "Paris" in whole.choices[0].message.content
    parts = [p async for p in await oll.chat(model=MODEL, messages=messages, stream=True,
                                            options={"num_predict": 30, "temperature": 0})]
    assert len(parts) > 2 and parts[-1].done
    assert "".join(p.message.content for p in parts) == whole.choices[0].message.content


async def test_a_completions_prompt_of_token_ids_answers_as_its_text_does(velo_default):
    """lm-eval's local-completions sends the prompt as token ids by default; Velo refused every token array. The
    engine reads them as they are, so they answer as the text its tokenizer gave them for."""
    ids = gguf_tokenizer(default_model_path()).encode("The capital of France is")
    oai, _ = clients(velo_default)
    asked = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    text = await oai.completions.create(prompt="The capital of France is", **asked)
    given = await oai.completions.create(prompt=ids, **asked)
    assert given.choices[0].text == text.choices[0].text and given.usage.prompt_tokens == len(ids)


async def test_structured_output_always_matches_the_schema(velo_default):
    oai, oll = clients(velo_default)
    ask = [{"role": "user", "content": "Describe a person called Ada."}]
    for seed in range(3):
        r = await oai.chat.completions.create(
            model=MODEL, messages=ask, temperature=1.0, seed=seed, max_tokens=120,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    parts = [p async for p in await oll.chat(model=MODEL, messages=ask, format=PERSON, stream=True,
                                            options={"temperature": 0.8, "seed": 7, "num_predict": 120})]
    jsonschema.validate(json.loads("".join(p.message.content for p in parts)), PERSON)


async def test_forced_tool_calls_are_valid_in_both_dialects(velo_default):
    oai, oll = clients(velo_default)
    ask = [{"role": "user", "content": "What's the weather in Rome?"}]
    r = await oai.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], tool_choice="required",
                                          temperature=0, max_tokens=80)
    [call] = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    # Ollama has no tool_choice: tools are offered and the model may answer or call; a call must validate
    reply = await oll.chat(model=MODEL, messages=ask, tools=[WEATHER], options={"temperature": 0, "num_predict": 80})
    for c in reply.message.tool_calls or []:
        assert c.function.name == "get_weather"
        jsonschema.validate(dict(c.function.arguments), WEATHER["function"]["parameters"])
    assert reply.message.tool_calls or reply.message.content.strip()


async def test_autocomplete_on_the_shipped_model_gets_ollamas_insert_error(velo_default):
    """SmolLM2's vocabulary has no fill-in-the-middle markers: /api/generate with a suffix is Ollama's 400, the
    OpenAI dialect's too, and /api/show does not offer `insert`."""
    body = {"model": MODEL, "prompt": "def add(a, b):\n    return ", "suffix": "\n\nprint(add(1, 2))\n",
            "stream": False}
    async with aiohttp.ClientSession() as http:
        async with http.post(velo_default + "/api/generate", json=body) as resp:
            assert resp.status == 400 and await resp.json() == {"error": f'"{MODEL}" does not support insert'}
        async with http.post(velo_default + "/v1/completions", json=body) as resp:
            assert resp.status == 400 and "does not support insert" in (await resp.json())["error"]["message"]
        async with http.post(velo_default + "/api/show", json={"model": MODEL}) as resp:
            assert "insert" not in (await resp.json())["capabilities"]


async def test_show_on_the_shipped_model_carries_its_files_description(velo_default):
    """Ollama's show lists the GGUF's general.* keys; Copilot names a model by `general.basename`."""
    async with aiohttp.ClientSession() as http:
        async with http.post(velo_default + "/api/show", json={"model": MODEL}) as resp:
            info = (await resp.json())["model_info"]
    assert info["general.basename"] == "smollm2" and info["general.size_label"] == "135M"
    assert info["general.architecture"] == "llama" and info["general.parameter_count"] > 100_000_000
