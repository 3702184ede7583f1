"""Ollama backend over its native API (`/api/*`), so every `options` key, `context`, `think` and `keep_alive`
survives the trip. This module is the one place that converts Velo's internal types to and from Ollama's wire
shapes (docs/api.md of ollama/ollama).
"""
from __future__ import annotations

from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, AsyncIterator

from aiohttp import StreamReader

from . import model_card, options
from .base import Backend, BackendConfig
from .errors import BackendError, BadRequest, NonFiniteEmbedding, Unsupported
from .fields import count, nests_deeper, wire_text
from .http import Upstream, asked_of, json_object, one_answer
from .protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, Message, ModelInfo,
                       RunningModel, SamplingOptions, TokenLogprob, ToolCall, Usage)
from .tool_prompt import in_prompt

def options_to_wire(o: SamplingOptions) -> dict[str, Any]:
    """`extra` first, so Velo's named fields win when both say something."""
    return {**o.extra, **options.write("ollama", o)}


def message_to_wire(m: Message, call_names: dict[str, str]) -> dict[str, Any]:
    """`call_names` (call id -> tool name) names the tool of an OpenAI-dialect answer, which carries only an id."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.images:
        out["images"] = m.images
    if m.tool_calls:
        out["tool_calls"] = [{"function": {"name": c.name, "arguments": c.arguments}} | ({"id": c.id} if c.id else {})
                             for c in m.tool_calls]
    if tool_name := m.tool_name or call_names.get(m.tool_call_id, ""):
        out["tool_name"] = tool_name
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.thinking:
        out["thinking"] = m.thinking
    return out


def _common(body: dict[str, Any], req: ChatRequest | CompletionRequest) -> dict[str, Any]:
    body.update(model=req.model, stream=req.stream)
    if opts := options_to_wire(req.options):
        body["options"] = opts
    if req.options.logprobs:
        body["logprobs"] = True
        if req.options.top_logprobs is not None:
            body["top_logprobs"] = req.options.top_logprobs
    for key in ("format", "keep_alive", "think", "truncate", "shift"):
        if (value := getattr(req, key)) is not None:
            body[key] = value
    return body


def chat_to_wire(req: ChatRequest) -> dict[str, Any]:
    """Ollama has no `tool_choice`: under "none" the tools stay out, so it parses no call the client said not to
    make (the model's calls reached the client as calls) and a model without the `tools` capability is not refused
    ("does not support tools"); the other backends are sent the tools with `tool_choice: none`."""
    if req.tools_in_prompt:
        req = in_prompt(req)
    names = {c.id: c.name for m in req.messages for c in m.tool_calls if c.id}
    body: dict[str, Any] = {"messages": [message_to_wire(m, names) for m in req.messages]}
    if req.tools and req.tool_choice != "none":
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.parameters}} for t in req.tools]
    return _common(body, req)


def generate_to_wire(req: CompletionRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": req.prompt}
    for key in ("suffix", "system", "template", "context"):
        if (value := getattr(req, key)) is not None:
            body[key] = value
    if req.raw and not req.suffix:  # Ollama builds a fill-in-the-middle only in the model's template, which raw skips
        body["raw"] = True
    if req.images:
        body["images"] = req.images
    return _common(body, req)


def usage_from_wire(obj: dict[str, Any]) -> Usage:
    return Usage(prompt_tokens=count(obj, "prompt_eval_count"), completion_tokens=count(obj, "eval_count"),
                 load_ns=count(obj, "load_duration"), prompt_eval_ns=count(obj, "prompt_eval_duration"),
                 eval_ns=count(obj, "eval_duration"))


def logprobs_from_wire(items: list[dict[str, Any]] | None) -> list[TokenLogprob]:
    return [TokenLogprob.from_wire(i) for i in items or []]


def chunk_from_wire(obj: dict[str, Any], backend: str) -> Chunk:
    """One `/api/chat` or `/api/generate` line of `backend`'s as a Chunk."""
    if "error" in obj:
        raise BackendError(f"backend {backend!r} failed mid-stream: {obj['error']}")
    msg = obj.get("message") or {}
    chunk = Chunk(text=wire_text(msg.get("content")) or wire_text(obj.get("response")),
                  thinking=wire_text(msg.get("thinking")) or wire_text(obj.get("thinking")),
                  tool_calls=[_tool_call(c) for c in msg.get("tool_calls") or []],
                  logprobs=logprobs_from_wire(obj.get("logprobs")))
    if obj.get("done"):
        reason = obj.get("done_reason") or "stop"
        chunk.finish_reason = "length" if reason == "length" else "stop"
        chunk.usage = usage_from_wire(obj)
        chunk.context = obj.get("context")
    return chunk


def _tool_call(raw: dict[str, Any]) -> ToolCall:
    """Ollama sends arguments as an object (api.md "Chat request (with tools)")."""
    args = raw["function"].get("arguments") or {}
    if not isinstance(args, dict) or nests_deeper(args):
        raise TypeError("tool call arguments are not a JSON object of sane depth")
    return ToolCall(name=wire_text(raw["function"]["name"]), arguments=args, id=wire_text(raw.get("id")))


def model_info_from_wire(name: str, backend: str, obj: dict[str, Any]) -> ModelInfo:
    """An /api/tags or /api/ps entry, or an /api/show answer, as ModelInfo."""
    details = obj.get("details") or {}
    model_info = obj.get("model_info") or {}
    context = model_card.file_context(model_info, details.get("family", ""))
    info = ModelInfo(name=name, backend=backend, size=count(obj, "size"), digest=wire_text(obj.get("digest")),
                     family=wire_text(details.get("family")), format=wire_text(details.get("format")),
                     parameter_size=wire_text(details.get("parameter_size")),
                     quantization_level=wire_text(details.get("quantization_level")),
                     context_length=context or count(obj, "context_length", None),
                     template=wire_text(obj.get("template")), parameters=wire_text(obj.get("parameters")),
                     system=wire_text(obj.get("system")), license=wire_text(obj.get("license")),
                     model_info=model_info)
    # read here, in the call's parse, where a wrong type is a 502 rather than a 500 later; a date or a capability
    # that is not a string is left out instead, which costs the listing nothing
    if isinstance(modified := obj.get("modified_at"), str) and modified:
        info.modified_at = modified
    # none where Ollama says none, as its /api/tags before v0.30.0: Velo's assumed "completion" listed an embedding
    # model as `["completion", "tools"]` where Ollama's /api/show says `["embedding"]`
    capabilities = obj.get("capabilities")
    info.capabilities = [c for c in capabilities if isinstance(c, str)] if isinstance(capabilities, list) else []
    info.shown = {k: obj[k] for k in PASSED_ON if k in obj}  # as sent: Ollama leaves an empty one out itself
    return info


# ShowResponse's fields (api/types.go) that Velo has no model of, passed on as the backend gave them: a Modelfile's
# MESSAGE lines (`ollama run` prints them), a vision model's projector metadata (clients look for
# clip.has_vision_encoder there), the GGUF's tensors, the model's renderer and parser, a cloud model's remote
# name and host, the least Ollama version it needs
PASSED_ON = ("renderer", "parser", "messages", "remote_model", "remote_host", "projector_info", "tensors", "requires")


@dataclass
class _StreamState:
    """What one answer needs across lines: Ollama says "stop" even when the model called tools."""

    saw_tool_calls: bool = False
    done: bool = False
    raw: bool = False  # a raw generate's answer has no context (a raw fill-in-the-middle goes as one that is not raw)

    def take(self, chunk: Chunk) -> Chunk:
        self.saw_tool_calls |= bool(chunk.tool_calls)
        if self.raw:
            chunk.context = None
        if chunk.finish_reason:
            self.done = True
            if self.saw_tool_calls and chunk.finish_reason == "stop":
                chunk.finish_reason = "tool_calls"
        return chunk


# Ollama's own refusal of a vector with NaN or Inf in it, which it answers 400 (server/routes.go, normalize)
_NON_FINITE = "embedding contains NaN or Inf values"


def _embeddings(obj: dict[str, Any]) -> EmbedResult:
    if not isinstance(obj["embeddings"], list) or not all(isinstance(e, list) for e in obj["embeddings"]):
        raise TypeError("embeddings is not an array of arrays of numbers")
    return EmbedResult(embeddings=obj["embeddings"], prompt_tokens=count(obj, "prompt_eval_count"),
                       load_ns=count(obj, "load_duration"))


def _embedding(obj: dict[str, Any]) -> list[float]:
    """The legacy /api/embeddings answer's one vector (read in the call's parse: a missing or odd one is a 502)."""
    if not isinstance(vector := obj["embedding"], list):
        raise TypeError("embedding is not an array of numbers")
    return vector


class OllamaBackend(Backend):
    constrains_format = True  # Ollama decodes `format` under a grammar
    fits_context = True  # Ollama drops a chat's oldest turns to fit num_ctx, and trims /api/generate prompts
    own_defaults = "ollama"  # its api.DefaultOptions, under every option /api/chat leaves unset
    shows_every_model = True  # /api/show and /api/chat look a name up alike (GetModel)

    def __init__(self, config: BackendConfig):
        super().__init__(config)
        self.http = Upstream(config)

    async def close(self) -> None:
        await self.http.close()

    async def health(self) -> bool:
        try:
            async with self.http.request("GET", "/", wait=self.config.connect_timeout) as resp:
                return resp.status == 200
        except BackendError:
            return False

    async def list_models(self) -> list[ModelInfo]:
        return await self.http.call("GET", "/api/tags", parse=lambda tags: [
            model_info_from_wire(m.get("name") or m["model"], self.name, m) for m in tags.get("models", [])])

    async def show(self, model: str, verbose: bool = False) -> ModelInfo:
        """`verbose` asked of Ollama too: its model_info then holds the long arrays (tokenizer.ggml.tokens) that it
        otherwise sends as []."""
        body = {"model": model, "verbose": True} if verbose else {"model": model}
        return await self.http.call("POST", "/api/show", body, model=model,
                                    parse=lambda obj: model_info_from_wire(model, self.name, obj))

    async def load(self, model: str, keep: Any) -> int:
        """Ollama's own load request, passed on: an empty /api/generate, or for a model that only embeds an empty
        /api/embed, as GenerateHandler refuses such a model even a load (`"x" does not support generate`)."""
        embeds = "completion" not in (await self.show(model)).capabilities
        body = {"model": model} | ({} if keep is None else {"keep_alive": keep})
        return await self.http.call("POST", "/api/embed" if embeds else "/api/generate", body, model=model,
                                    parse=lambda obj: count(obj, "load_duration"))

    async def unload(self, model: str) -> None:
        await self.http.call("POST", "/api/generate", {"model": model, "keep_alive": 0}, model=model)

    async def running(self) -> list[RunningModel]:
        return await self.http.call("GET", "/api/ps", parse=self._running)

    def _running(self, ps: dict[str, Any]) -> list[RunningModel]:
        out = []
        for m in ps.get("models", []):
            info = model_info_from_wire(m.get("name") or m["model"], self.name, m)
            out.append(RunningModel(name=info.name, size=info.size, size_vram=m.get("size_vram", 0),
                                    digest=info.digest, expires_at=m.get("expires_at", info.modified_at),
                                    context_length=m.get("context_length"), info=info))
        return out

    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        stream = self._generate("/api/chat", chat_to_wire(asked_of(req, self.config)), req.model)
        return stream if req.stream else one_answer(stream)

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        if req.prompt_ids is not None:  # /api/generate's prompt is text, and its /v1/completions' a string too
            raise Unsupported(f"backend {self.name!r} (ollama) cannot complete token ids: Ollama takes the prompt as "
                              "text only; send it as a string or an array of strings", param="prompt")
        stream = self._generate("/api/generate", generate_to_wire(asked_of(req, self.config)), req.model, req.raw)
        return stream if req.stream else one_answer(stream)

    async def _generate(self, path: str, body: dict[str, Any], model: str, raw: bool = False) -> AsyncIterator[Chunk]:
        """A stream from Ollama, whatever the client asked, unless `always_stream = false` (see adapters/http.py);
        its one answer is the stream's last line with everything in it."""
        state = _StreamState(raw=raw)
        async with aclosing(self.http.generation(
                path, body, model=model, ndjson=True, parse=lambda obj: state.take(chunk_from_wire(obj, self.name)),
                whole=lambda answer: state.take(chunk_from_wire(json_object(answer), self.name)),
                last=lambda _: state.done)) as events:
            async for chunk in events:
                yield chunk
        if not state.done:
            raise BackendError(f"backend {self.name!r} ended the {path} stream before it was done")

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        # Ollama's /api/embed, and its /v1/embeddings that hands `input` on to it, take strings only: any other is
        # its 400 "invalid input type" (server/routes.go EmbedHandler, middleware/openai.go EmbeddingsMiddleware)
        if req.tokenized:
            raise Unsupported(f"backend {self.name!r} (ollama) cannot embed token ids: Ollama takes the input as text "
                              "only; send it as a string or an array of strings", param="input")
        if not req.normalize:  # the legacy route, which Ollama answers with the raw vector
            return await self._legacy_embed(req)
        body: dict[str, Any] = {"model": req.model, "input": req.inputs, "truncate": req.truncate}
        if req.options:
            body["options"] = req.options
        for key, value in (("dimensions", req.dimensions), ("keep_alive", req.keep_alive)):
            if value is not None:
                body[key] = value
        try:
            return await self.http.call("POST", "/api/embed", body, model=req.model, parse=_embeddings,
                                        wait=self.http.embedding_wait(len(req.inputs)))
        except BadRequest as e:  # the model's fault, not the client's: as a vector from any other backend
            if _NON_FINITE not in e.message:
                raise
            raise NonFiniteEmbedding(f"backend {self.name!r} embedded an input to NaN or infinite values (Ollama: "
                                     f"{_NON_FINITE})") from e

    async def _legacy_embed(self, req: EmbedRequest) -> EmbedResult:
        vectors = []
        for text in req.inputs:
            body = {"model": req.model, "prompt": text} | ({"options": req.options} if req.options else {})
            if req.keep_alive is not None:
                body["keep_alive"] = req.keep_alive
            vectors.append(await self.http.call("POST", "/api/embeddings", body, model=req.model, parse=_embedding,
                                                wait=self.http.embedding_wait(1)))
        return EmbedResult(embeddings=vectors)

    async def manage(self, method: str, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Pass /api/pull, /api/push, /api/create, /api/copy, /api/delete through; empty answers yield nothing."""
        model = body.get("model") or body.get("name") or body.get("source")
        cfg = self.config
        async with self.http.request(method, path, body, wait=cfg.first_token_timeout, model=model) as resp:
            async for obj in self.http.ndjson(resp, first_wait=cfg.first_token_timeout, total=None,
                                              parse=json_object):
                if "error" in obj:
                    raise BackendError(self.http.scrubbed(f"backend {self.name!r} failed on {path}: {obj['error']}"))
                yield obj

    async def blob(self, method: str, digest: str, body: StreamReader | None) -> int:
        """A model file's check (HEAD) or upload (POST, `body` as it arrives) at /api/blobs, which `ollama create`
        sends before a create from a GGUF: Ollama's status (200 held, 201 stored). Its 400 (a digest that does not
        match) and 404 (not held) come back as it sent them; the whole upload within `total_timeout`."""
        async with self.http.request(method, f"/api/blobs/{digest}", wait=self.config.total_timeout,
                                     as_is=(400, 404), raw=body) as resp:
            return resp.status
