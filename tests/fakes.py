"""In-process fake upstreams for tests and benchmarks: aiohttp apps on 127.0.0.1, port 0.

`OllamaDouble` is a protocol double of Ollama's native API (Ollama itself cannot run here). Every request and
response shape follows Ollama's own documentation, docs/api.md in ollama/ollama ("api.md" below, section named
in each handler), and the `ollama` Python client's `_types.py` for fields api.md leaves implicit (`think` /
`thinking`, `logprobs` as server/logprob.go writes them, `context_length` in /api/ps). `FakeOpenAI` is a minimal,
fast OpenAI-compatible server (`/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`) shaped
after the OpenAI API reference (platform.openai.com/docs/api-reference: "Chat", "The chat completion chunk object",
"Completions", "Embeddings", "Models", "Error codes"), as the `openai` Python client's `types/` model them:
streamed tool-call arguments are string fragments, usage comes in a last chunk with empty `choices` when
`stream_options.include_usage` is set.

Both share the knobs of `Script` (reply text, tool calls, per-token delay, failing status, cutting the stream, a
malformed event mid-stream, a whole answer of any shape) and record what they received in `requests`;
`disconnects` counts streams whose client went away mid-way.

    async with OllamaDouble() as ollama:          # or FakeOpenAI(api_key="k")
        ollama.script.token_delay = 0.05
        ... BackendConfig(name="o", kind="ollama", urls=[ollama.url]) ...
        assert ollama.last("/api/chat")["options"]["num_predict"] == 5
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import random
import re
import string
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import orjson
from aiohttp import web


@dataclass
class Script:
    """What the fake answers and how it misbehaves; tests change it between requests."""

    reply: str = "Hello from the double, nice to meet you."
    thinking: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments": dict | raw str}
    token_delay: float = 0.0  # seconds before each streamed chunk (OpenAI's one answer: per word, before it)
    fail_status: int | None = None  # answer every request with this error status
    fail_message: str = "simulated failure"
    fail_retry_after: str | None = None  # the failing answer's Retry-After header, as a busy server sends it
    cut_after: int | None = None  # drop the connection after this many streamed chunks
    malformed: bytes | None = None  # a streamed line sent in place of the one at `malformed_at` (then the rest)
    malformed_at: int = 2
    answer: Any = None  # answer every POST with this JSON body (status 200), whatever its shape
    refused_field: str | None = None  # a 400 naming it for a request that has it (vLLM's V0 engine: cache_salt)
    finish_reason: str | None = None  # the OpenAI fake's in place of its own (content_filter, vLLM's abort)
    # (reply, each of its tokens' logprob) for each generation in turn, in place of `reply`: best_of's candidates
    replies: list[tuple[str, float]] = field(default_factory=list)
    logprobs: bool = True  # False: logprobs asked for are not given (Ollama before 0.12.11, a server without them)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def tokens(text: str) -> list[str]:
    """Words with their leading whitespace: the double's stand-in for model tokens."""
    return re.findall(r"\s*\S+", text)


def fake_embedding(text: str, dims: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [(digest[i % len(digest)] - 128) / 128 for i in range(dims)]


class FakeServer:
    """Runs `routes()` on a free loopback port; records requests; streams with the `Script`'s faults."""

    def __init__(self) -> None:
        self.script = Script()
        self.requests: list[Received] = []
        self.disconnects = 0
        self.turns = 0  # generations answered from `script.replies`
        self.url = ""
        self.max_body = 1024 * 1024  # aiohttp's default; a benchmark's upload (bench/blob_upload.py) sets more
        self._runner: web.AppRunner | None = None

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        raise NotImplementedError

    def error(self, status: int, message: str) -> web.Response:
        return web.json_response(self.error_body(status, message), status=status)

    def reply(self) -> tuple[str, float]:
        """The next generation's reply and each of its tokens' logprob."""
        if not self.script.replies:
            return self.script.reply, -0.25
        self.turns += 1
        return self.script.replies[(self.turns - 1) % len(self.script.replies)]

    def last(self, path: str) -> Any:
        """The body of the latest request to `path`."""
        return next(r.body for r in reversed(self.requests) if r.path == path)

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()  # a file uploaded to /api/blobs is no JSON: recorded without its body
        body = json.loads(raw) if raw and not request.path.startswith("/api/blobs/") else None  # integers whole
        self.requests.append(Received(request.method, request.path, dict(request.headers), body))
        if self.script.fail_status:
            failed = self.error(self.script.fail_status, self.script.fail_message)
            if self.script.fail_retry_after is not None:
                failed.headers["Retry-After"] = self.script.fail_retry_after
            return failed
        if self.script.answer is not None and request.method == "POST":
            return web.json_response(self.script.answer)
        if isinstance(body, dict) and self.script.refused_field in body:
            return self.error(400, f"Parameter '{self.script.refused_field}' is not supported with this "
                                   "configuration (engine V0)")
        return self.refuse(request) or await handler(request)

    def refuse(self, request: web.Request) -> web.Response | None:
        """An error answer before any handler runs (authentication), or None."""
        return None

    async def start(self) -> "FakeServer":
        app = web.Application(middlewares=[self._record], client_max_size=self.max_body)
        app.add_routes(self.routes())
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> "FakeServer":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def stream(self, request: web.Request, lines: Iterable[bytes], content_type: str) -> web.StreamResponse:
        """Write `lines` one by one, honouring the delay / cut knobs and noticing a client that went away."""
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        for n, line in enumerate(lines):
            if self.script.cut_after is not None and n >= self.script.cut_after:
                request.transport.close()  # mid-stream failure: the chunked body never ends
                return resp
            if self.script.token_delay:
                await asyncio.sleep(self.script.token_delay)
            if request.transport is None or request.transport.is_closing():
                self.disconnects += 1
                return resp
            if self.script.malformed is not None and n == self.script.malformed_at:
                line = self.script.malformed
            try:
                await resp.write(line)
            except ConnectionResetError:
                self.disconnects += 1
                return resp
        await resp.write_eof()
        return resp


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


def _logprobs(body: dict[str, Any], words: list[str], logprob: float = -0.25) -> dict[str, Any]:
    """Ollama 0.12.11's `logprobs` (server/logprob.go): one entry per token when asked for, `bytes` as integers,
    `top_logprobs` alternatives (the token itself first, then " x", " y", ...) when `top_logprobs` > 0."""
    if not body.get("logprobs"):
        return {}

    def token(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
    top = body.get("top_logprobs") or 0
    return {"logprobs": [{**token(w, logprob), **({"top_logprobs": [token(w, logprob)] + [
        token(f" {chr(120 + i)}", -2.0 - i) for i in range(top - 1)]} if top else {})} for w in words]}


def _ndjson(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


@dataclass
class FakeModel:
    name: str
    family: str = "llama"
    context_length: int = 8192
    capabilities: list[str] = field(default_factory=lambda: ["completion", "tools", "insert"])
    size: int = 98_000_000
    system: str = ""  # its Modelfile's SYSTEM (a CreateRequest's `system`)
    license: str = ""  # its LICENSE layer's text (ShowResponse `license`, omitempty)
    # ShowResponse's other omitempty fields, as server/routes.go GetModelInfo fills them: the Modelfile's MESSAGE
    # lines, a cloud model's name and host (then no tensors: "skip loading tensor information if this is a remote
    # model"), the projector file's key-values (a vision model), the model's renderer, parser and least version
    messages: list[dict[str, str]] = field(default_factory=list)
    remote_model: str = ""
    remote_host: str = ""
    projector_info: dict[str, Any] = field(default_factory=dict)
    renderer: str = ""
    parser: str = ""
    requires: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.name.encode()).hexdigest()

    @property
    def details(self) -> dict[str, Any]:
        # api.md "List Local Models" / "Show Model Information": the `details` object.
        return {"parent_model": "", "format": "gguf", "family": self.family, "families": [self.family],
                "parameter_size": "135M", "quantization_level": "Q4_1"}


def _verbose_or_short(kv: dict[str, Any], verbose: bool) -> dict[str, Any]:
    """server/routes.go getModelData: without `verbose`, an array of more than 5 items is sent as []."""
    return kv if verbose else {k: [] if isinstance(v, list) and len(v) > 5 else v for k, v in kv.items()}


_BLOB_DIGEST = re.compile(r"sha256[:-][0-9a-fA-F]{64}")  # manifest.BlobsPath


class OllamaDouble(FakeServer):
    """Ollama's native API, field for field as api.md documents it."""

    def __init__(self, models: Iterable[str] = ("smollm2:135m", "all-minilm:latest")) -> None:
        super().__init__()
        self.models = {name: FakeModel(name) for name in models}
        self.version = "0.12.6"
        self.blobs: dict[str, int] = {}  # digest -> size of the files uploaded to /api/blobs

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/", self.root), web.get("/api/version", self.api_version),
                web.get("/api/tags", self.tags), web.post("/api/show", self.show), web.get("/api/ps", self.ps),
                web.post("/api/chat", self.chat), web.post("/api/generate", self.generate),
                web.post("/api/embed", self.embed), web.post("/api/embeddings", self.embeddings),
                web.post("/api/pull", self.pull), web.post("/api/push", self.pull),
                web.post("/api/create", self.create), web.delete("/api/delete", self.delete),
                web.post("/api/copy", self.copy), web.post("/api/blobs/{digest}", self.create_blob),
                web.head("/api/blobs/{digest}", self.head_blob)]

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"error": message}  # Ollama errors are `{"error": "message"}`

    def _missing(self, name: str) -> web.Response:
        return self.error(404, f'model "{name}" not found, try pulling it first')

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")  # GET and HEAD / (what clients probe)

    async def api_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    async def tags(self, request: web.Request) -> web.Response:
        # api.md "List Local Models"; `model` mirrors `name` as current servers send both.
        return web.json_response({"models": [
            {"name": m.name, "model": m.name, "modified_at": "2025-01-01T00:00:00Z", "size": m.size,
             "digest": m.digest, "details": m.details} for m in self.models.values()]})

    async def show(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body.get("model") or body.get("name", "")  # older clients send "name"
        if (m := self.models.get(name)) is None:
            return self._missing(name)
        # api.md "Show Model Information" (+ `capabilities`, which current servers add; `system`, omitempty).
        system = f'SYSTEM """{m.system}"""\n' if m.system else ""
        verbose, remote = body.get("verbose") is True, bool(m.remote_host and m.remote_model)
        return web.json_response({
            "modelfile": f"FROM {name}\n{system}PARAMETER num_ctx {m.context_length}",
            "parameters": 'stop                           "<|im_end|>"',
            "template": "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
                        "<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n",
            "details": m.details, "capabilities": m.capabilities, "modified_at": "2025-01-01T00:00:00Z",
            "model_info": {"general.architecture": m.family, f"{m.family}.context_length": m.context_length}
            if remote else _verbose_or_short({  # a cloud model's is its config's few keys
                "general.architecture": m.family, "general.parameter_count": 134_515_008,
                f"{m.family}.context_length": m.context_length, f"{m.family}.embedding_length": 576,
                "tokenizer.ggml.tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "c"],
                "tokenizer.ggml.eos_token_id": 2, "general.tags": ["text"]}, verbose),
            **({"tensors": [{"name": "token_embd.weight", "type": "Q8_0", "shape": [576, 49152]},
                            {"name": "output_norm.weight", "type": "F32", "shape": [576]}]} if not remote else {}),
            **({"projector_info": _verbose_or_short(m.projector_info, verbose)} if m.projector_info else {}),
            **{k: v for k, v in (("system", m.system), ("license", m.license), ("messages", m.messages),
                                 ("remote_model", m.remote_model), ("remote_host", m.remote_host),
                                 ("renderer", m.renderer), ("parser", m.parser), ("requires", m.requires)) if v}})

    async def ps(self, request: web.Request) -> web.Response:
        # api.md "List Running Models" (+ `context_length` from the client's ProcessResponse).
        return web.json_response({"models": [
            {"name": m.name, "model": m.name, "size": m.size, "digest": m.digest, "details": m.details,
             "expires_at": "2099-01-01T00:00:00Z", "size_vram": 0, "context_length": m.context_length}
            for m in self.models.values()]})

    def _final(self, body: dict[str, Any], prompt_words: int, eval_count: int, started: float,
               reason: str) -> dict[str, Any]:
        # api.md "Generate a completion": the final object's statistics, durations in nanoseconds.
        total = max(int((time.perf_counter() - started) * 1e9), 1000)
        return {"done": True, "done_reason": reason, "total_duration": total, "load_duration": 1000,
                "prompt_eval_count": prompt_words, "prompt_eval_duration": total // 4,
                "eval_count": eval_count, "eval_duration": total // 2}

    def _reply_tokens(self, body: dict[str, Any], reply: str) -> tuple[list[str], str]:
        """The scripted reply cut to `options.num_predict`, and the done_reason that follows."""
        words = tokens(reply)
        limit = (body.get("options") or {}).get("num_predict")
        if limit is not None and 0 <= limit < len(words):
            return words[:limit], "length"
        return words, "stop"

    def _tool_calls(self) -> list[dict[str, Any]]:
        # api.md "Chat request (with tools)": arguments are an object, not a string; server/routes.go gives each
        # call an `id` (toolCallId: "call_" and 8 random lowercase letters or digits) and its `index`.
        return [{"id": "call_" + "".join(random.choices(string.ascii_lowercase + string.digits, k=8)),
                 "function": {"index": i, "name": c["name"], "arguments": c["arguments"]}}
                for i, c in enumerate(self.script.tool_calls)]

    def _refused(self, name: str, route: str) -> web.Response | None:
        """server/routes.go: a model that only embeds is refused a chat or a generation, its load included."""
        if "completion" in self.models[name].capabilities:
            return None
        return self.error(400, f'"{name}" does not support {route}')

    async def chat(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        body = await request.json()
        head = {"model": body.get("model", ""), "created_at": _now()}
        if body.get("model") not in self.models:
            return self._missing(body.get("model", ""))
        if (refused := self._refused(body["model"], "chat")) is not None:
            return refused
        if not body.get("messages"):  # api.md "Load a model" / "Unload a model" for chat
            reason = "unload" if body.get("keep_alive") == 0 else "load"
            return web.json_response({**head, "message": {"role": "assistant", "content": ""},
                                      "done_reason": reason, "done": True})
        words, reason = self._reply_tokens(body, self.script.reply)
        prompt_words = sum(len(tokens(m.get("content") or "")) for m in body["messages"])
        think = self.script.thinking if body.get("think") else ""
        calls = bool(self.script.tool_calls and body.get("tools"))  # Ollama parses calls only when given tools
        if body.get("stream", True) is False:  # api.md "Chat request (No streaming)"
            msg = {"role": "assistant", "content": "".join(words)}
            if think:
                msg["thinking"] = think
            if calls:
                msg["tool_calls"] = self._tool_calls()
            return web.json_response({**head, "message": msg, **_logprobs(body, words),
                                      **self._final(body, prompt_words, len(words), started, reason)})

        def lines() -> Iterable[bytes]:  # api.md "Chat Request (Streaming)"
            for piece in tokens(think):
                yield _ndjson({**head, "message": {"role": "assistant", "content": "", "thinking": piece},
                               "done": False})
            for word in words:
                yield _ndjson({**head, "message": {"role": "assistant", "content": word}, **_logprobs(body, [word]),
                               "done": False})
            if calls:
                yield _ndjson({**head, "message": {"role": "assistant", "content": "",
                                                   "tool_calls": self._tool_calls()}, "done": False})
            yield _ndjson({**head, "message": {"role": "assistant", "content": ""},
                           **self._final(body, prompt_words, len(words), started, reason)})
        return await self.stream(request, lines(), "application/x-ndjson")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        body = await request.json()
        head = {"model": body.get("model", ""), "created_at": _now()}
        if body.get("model") not in self.models:
            return self._missing(body.get("model", ""))
        unloads = not body.get("prompt") and body.get("keep_alive") == 0  # before the capabilities, as Ollama
        if not unloads and (refused := self._refused(body["model"], "generate")) is not None:
            return refused
        if not body.get("prompt"):  # GenerateHandler: "unload" for keep_alive 0, else "load"
            reason = "unload" if body.get("keep_alive") == 0 else "load"
            return web.json_response({**head, "response": "", "done": True, "done_reason": reason})
        reply, logprob = self.reply()
        words, reason = self._reply_tokens(body, reply)
        final = self._final(body, len(tokens(body["prompt"])), len(words), started, reason)
        asked = body if self.script.logprobs else {}
        if not body.get("raw"):  # api.md "Request (Raw Mode)": raw mode does not return a context
            final["context"] = list(body.get("context") or []) + list(range(1, len(words) + 2))
        if body.get("stream", True) is False:  # api.md "Request (No streaming)"
            return web.json_response({**head, "response": "".join(words), **_logprobs(asked, words, logprob), **final})

        def lines() -> Iterable[bytes]:  # api.md "Generate request (Streaming)"
            for word in words:
                yield _ndjson({**head, "response": word, **_logprobs(asked, [word], logprob), "done": False})
            yield _ndjson({**head, "response": "", **final})
        return await self.stream(request, lines(), "application/x-ndjson")

    async def embed(self, request: web.Request) -> web.Response:
        body = await request.json()  # api.md "Generate Embeddings"
        if body.get("model") not in self.models:
            return self._missing(body.get("model", ""))
        raw = body.get("input")
        inputs = ([raw] if raw else []) if raw is None or isinstance(raw, str) else raw
        if not inputs:  # EmbedHandler: a request without input loads the model, and says nothing more
            return web.json_response({"model": body["model"], "embeddings": []})
        dims = body.get("dimensions") or 8
        return web.json_response({"model": body["model"], "embeddings": [fake_embedding(t, dims) for t in inputs],
                                  "total_duration": 14143917, "load_duration": 1019500,
                                  "prompt_eval_count": sum(len(tokens(t)) for t in inputs)})

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()  # api.md "Generate Embedding" (legacy, superseded by /api/embed)
        if body.get("model") not in self.models:
            return self._missing(body.get("model", ""))
        if not body.get("prompt"):  # EmbeddingsHandler: "an empty request loads the model"
            return web.json_response({"embedding": []})
        return web.json_response({"embedding": fake_embedding(body["prompt"], 8)})

    async def _progress(self, request: web.Request, statuses: list[dict[str, Any]]) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream", True) is False:  # api.md "Pull a Model": one object when not streamed
            return web.json_response({"status": "success"})
        return await self.stream(request, (_ndjson(s) for s in statuses), "application/x-ndjson")

    async def pull(self, request: web.Request) -> web.StreamResponse:
        name = (await request.json()).get("model", "")
        self.models.setdefault(name, FakeModel(name))
        digest = "sha256:" + FakeModel(name).digest  # api.md "Pull a Model" / "Push a Model" progress lines
        return await self._progress(request, [
            {"status": "pulling manifest"},
            {"status": f"downloading {digest}", "digest": digest, "total": 2142590208, "completed": 241970},
            {"status": f"downloading {digest}", "digest": digest, "total": 2142590208, "completed": 2142590208},
            {"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"}])

    async def head_blob(self, request: web.Request) -> web.Response:
        """server/routes.go HeadBlobHandler: 200 held, 404 not; manifest.BlobsPath's 400 for a name not a digest."""
        digest = request.match_info["digest"]
        if not _BLOB_DIGEST.fullmatch(digest):
            return self.error(400, "invalid digest format")
        return web.Response() if digest in self.blobs else self.error(404, f'blob "{digest}" not found')

    async def create_blob(self, request: web.Request) -> web.Response:
        """CreateBlobHandler: 200 held already, else the body's sha256 must be the digest: 201."""
        digest = request.match_info["digest"]
        if not _BLOB_DIGEST.fullmatch(digest):
            return self.error(400, "invalid digest format")
        if digest in self.blobs:
            return web.Response()
        data = await request.read()  # as `_record` read it
        if (got := "sha256:" + hashlib.sha256(data).hexdigest()) != digest:
            return self.error(400, f'digest mismatch, expected "{digest}", got "{got}"')
        self.blobs[digest] = len(data)
        return web.Response(status=201)

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = body.get("model", "")
        missing = [d for d in (body.get("files") or {}).values() if d not in self.blobs]
        if missing:  # convertModelFromFiles: a file not uploaded first fails to open, an error line in the stream
            blob = missing[0].replace(":", "-")
            return await self.stream(request, [_ndjson({"error": f"open /root/.ollama/models/blobs/{blob}: no such "
                                                                 "file or directory"})], "application/x-ndjson")
        self.models[name] = FakeModel(name, system=body.get("system") or "")  # api.md "Create a Model" status lines
        return await self._progress(request, [{"status": "reading model metadata"},
                                              {"status": "writing manifest"}, {"status": "success"}])

    async def delete(self, request: web.Request) -> web.Response:
        name = (await request.json()).get("model", "")  # api.md "Delete a Model": 200, or 404 if missing
        if self.models.pop(name, None) is None:
            return self._missing(name)
        return web.Response()

    async def copy(self, request: web.Request) -> web.Response:
        body = await request.json()  # api.md "Copy a Model": 200, or 404 if the source is missing
        if body.get("source") not in self.models:
            return self._missing(body.get("source", ""))
        self.models[body["destination"]] = FakeModel(body["destination"])
        return web.Response()


def _completion_logprobs(asked: bool, words: list[str], logprob: float) -> dict[str, Any] | None:
    """vLLM's /v1/completions `logprobs` (parallel lists; each token its own one alternative), None unasked. An
    echoed prompt is not scored: Velo never asks for echo with logprobs."""
    if not asked:
        return None
    return {"tokens": words, "token_logprobs": [logprob] * len(words), "top_logprobs": [{w: logprob} for w in words],
            "text_offset": list(itertools.accumulate((len(w) for w in words[:-1]), initial=0))}


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class FakeOpenAI(FakeServer):
    """An OpenAI-compatible server (vLLM / LM Studio style); requires `Authorization: Bearer api_key` if given."""

    def __init__(self, models: Iterable[str] = ("fake-gpt",), api_key: str | None = None,
                 owner: str = "fake") -> None:
        super().__init__()
        self.models = list(models)
        self.api_key = api_key
        self.owner = owner  # the listing's `owned_by`: "vllm" and "sglang" are what those servers write there
        # where script.thinking comes: vLLM's name since 0.16 (it dropped the other); llama-server's and DeepSeek's
        # is "reasoning_content"
        self.reasoning_field = "reasoning"

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/v1/models", self.list_models), web.post("/v1/chat/completions", self.chat),
                web.post("/v1/completions", self.completions), web.post("/v1/embeddings", self.embeddings),
                web.post("/tokenize", self.tokenize)]

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                429: "rate_limit_error"}.get(status, "server_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def refuse(self, request: web.Request) -> web.Response | None:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self.error(401, "Incorrect API key provided")
        return None

    async def list_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": 1700000000, "owned_by": self.owner} for m in self.models]})

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize (only vLLM has it): the fake's own count of what a chat or a prompt would read."""
        if self.owner != "vllm":
            return self.error(404, "Not Found")
        body = await request.json()
        return web.json_response({"count": self._usage(body, 0)["prompt_tokens"], "max_model_len": 2048,
                                  "tokens": [], "token_strs": None})

    def _unknown(self, body: dict[str, Any]) -> web.Response | None:
        if body.get("model") not in self.models:
            return self.error(404, f"The model `{body.get('model')}` does not exist")
        top_p = body.get("top_p")  # vLLM's SamplingParams._verify_args (SGLang's too), before greedy resets it
        if top_p is not None and not 0 < top_p <= 1:
            return self.error(400, f"top_p must be in (0, 1], got {float(top_p)}.")
        return None

    def _words(self, body: dict[str, Any], reply: str) -> tuple[list[str], str, str | None]:
        """The reply's words, why they end, and the stop string that ended them: cut before the first of the
        request's `stop` strings, as vLLM cuts it and names it in `stop_reason` (its extension of the choice)."""
        stops, matched = body.get("stop") or [], None
        hits = [(reply.find(s), s) for s in ([stops] if isinstance(stops, str) else stops) if s in reply]
        if hits:
            cut, matched = min(hits)
            reply = reply[:cut]
        words, limit = tokens(reply), body.get("max_tokens")
        if limit is not None and limit < len(words):
            return words[:limit], "length", None
        if self.script.finish_reason is not None:
            return words, self.script.finish_reason, None
        return words, "tool_calls" if self.script.tool_calls else "stop", matched

    def _usage(self, body: dict[str, Any], completion: int) -> dict[str, int]:
        prompt = len(tokens(orjson.dumps(body.get("messages") or body.get("prompt") or "").decode()))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _calls(self) -> list[dict[str, Any]]:
        """Tool calls with string `arguments`; a raw string argument is sent verbatim (malformed JSON tests)."""
        return [{"id": f"call_{i}", "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str)
                              else orjson.dumps(c["arguments"]).decode()}}
                for i, c in enumerate(self.script.tool_calls)]

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if (missing := self._unknown(body)) is not None:
            return missing
        words, reason, matched = self._words(body, self.script.reply)
        head = {"id": "chatcmpl-fake", "created": int(time.time()), "model": body["model"]}
        if not body.get("stream"):
            await asyncio.sleep(self.script.token_delay * len(words))  # the whole answer is made before it is sent
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(words) or None}
            if self.script.thinking:
                msg[self.reasoning_field] = self.script.thinking
            if self.script.tool_calls:
                msg["tool_calls"] = self._calls()
            return web.json_response({**head, "object": "chat.completion", "usage": self._usage(body, len(words)),
                                      "choices": [{"index": 0, "message": msg, "finish_reason": reason,
                                                   "stop_reason": matched}]})
        head["object"] = "chat.completion.chunk"

        def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse({**head, "choices": [{"index": 0, "delta": d, "finish_reason": finish}]})

        def events() -> Iterable[bytes]:
            yield delta({"role": "assistant", "content": ""})
            for piece in tokens(self.script.thinking):
                yield delta({self.reasoning_field: piece})
            for word in words:
                yield delta({"content": word})
            for i, call in enumerate(self._calls()):  # name first, then the arguments string in two pieces
                args = call["function"]["arguments"]
                yield delta({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": ""}}]})
                for piece in (args[:len(args) // 2], args[len(args) // 2:]):
                    yield delta({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            yield _sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": reason,
                                             "stop_reason": matched}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                yield _sse({**head, "choices": [], "usage": self._usage(body, len(words))})
            yield b"data: [DONE]\n\n"
        return await self.stream(request, events(), "text/event-stream")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if (missing := self._unknown(body)) is not None:
            return missing
        reply, logprob = self.reply()
        words, reason, _ = self._words(body, reply)
        reason = "stop" if reason == "tool_calls" else reason
        asked = body.get("logprobs") is not None and self.script.logprobs
        shown = [body["prompt"], *words] if body.get("echo") else words  # echo as vLLM and SGLang answer it
        head = {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()), "model": body["model"]}
        if not body.get("stream"):
            return web.json_response({**head, "usage": self._usage(body, len(words)), "choices": [
                {"index": 0, "text": "".join(shown), "logprobs": _completion_logprobs(asked, words, logprob),
                 "finish_reason": reason}]})

        def events() -> Iterable[bytes]:
            for word in shown:
                yield _sse({**head, "choices": [{"index": 0, "text": word, "finish_reason": None,
                                                 "logprobs": _completion_logprobs(asked, [word], logprob)}]})
            yield _sse({**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": reason}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                yield _sse({**head, "choices": [], "usage": self._usage(body, len(words))})
            yield b"data: [DONE]\n\n"
        return await self.stream(request, events(), "text/event-stream")

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        if (missing := self._unknown(body)) is not None:
            return missing
        given = body["input"]  # a string, strings, one input's token ids, or inputs' ids (vLLM's four shapes)
        inputs = [given] if isinstance(given, str) or isinstance(given[0], int) else given
        dims = body.get("dimensions") or 8
        counted = sum(len(t) if isinstance(t, list) else len(tokens(t)) for t in inputs)  # ids: a token each
        return web.json_response({"object": "list", "model": body["model"], "data": [
            {"object": "embedding", "index": i, "embedding": fake_embedding(str(t), dims)}
            for i, t in enumerate(inputs)], "usage": {"prompt_tokens": counted, "total_tokens": counted}})
