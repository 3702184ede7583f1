"""llama.cpp's llama-server: chat and embeddings through its OpenAI-compatible routes (shared with
openai_compat), raw completion through native `/completion` (cache_prompt, n_predict, json_schema, n_probs),
fill-in-the-middle through `/infill`, and the server's own facts from `/props`, `/v1/models` and `/health`."""
from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any, AsyncIterator

from . import options
from .base import BackendConfig
from .errors import BackendError, Unsupported
from .fields import wire_text
from .http import json_object, one_answer
from .model_file import model_file
from .openai_compat import OpenAIBackend, as_chat
from .protocol import ChatRequest, Chunk, CompletionRequest, ModelInfo, SamplingOptions, TokenLogprob, Usage

log = logging.getLogger("velo.adapters.llamacpp")

def native_sampling(o: SamplingOptions) -> dict[str, Any]:
    """`extra` (Ollama option names such as mirostat pass as is; llama-server ignores unknown keys) first."""
    out = {**o.extra, **options.write("llamacpp", o)}
    if o.logprobs:
        out["n_probs"] = o.top_logprobs or 1
    return out


def native_body(req: CompletionRequest) -> dict[str, Any]:
    body = {"stream": req.stream, "cache_prompt": True, **native_sampling(req.options)}
    if req.format is not None:
        body["json_schema"] = {"type": "object"} if req.format == "json" else req.format
    if req.suffix is not None:
        body.update(input_prefix=req.prompt, input_suffix=req.suffix)
    else:
        body["prompt"] = req.prompt
    return body


def native_chunk(obj: dict[str, Any]) -> Chunk:
    """One `/completion` or `/infill` event; the last has `stop: true` and the counts."""
    chunk = Chunk(text=wire_text(obj.get("content")), logprobs=[
        TokenLogprob(p["token"], p["logprob"], [(t["token"], t["logprob"]) for t in p.get("top_logprobs") or []])
        for p in obj.get("completion_probabilities") or [] if "logprob" in p])
    if obj.get("stop"):
        timings = obj.get("timings") or {}
        chunk.finish_reason = "length" if obj.get("stop_type") == "limit" else "stop"
        chunk.usage = Usage(prompt_tokens=obj.get("tokens_evaluated", 0),
                            completion_tokens=obj.get("tokens_predicted", 0),
                            prompt_eval_ns=int(timings.get("prompt_ms", 0) * 1e6),
                            eval_ns=int(timings.get("predicted_ms", 0) * 1e6))
        chunk.usage.total_ns = chunk.usage.prompt_eval_ns + chunk.usage.eval_ns
    return chunk


def gguf_name(model_id: str) -> str:
    """llama-server names its model by the GGUF path: keep the file name without `.gguf`."""
    name = os.path.basename(model_id)
    return name[:-5] if name.endswith(".gguf") else name


def parameter_size(n: int) -> str:
    """Ollama's way of writing it: "135M", "1.5B"."""
    if not n:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


class LlamaCppBackend(OpenAIBackend):
    forces_tool_choice = False  # llama-server answers in prose to tool_choice "required" with generic templates
    constrains_format = True  # response_format and json_schema become a grammar
    # llama-server drops kept-alive connections after some streams, unannounced (2 of 6 sequential streamed
    # requests failed on a reused connection): a request sent on one cannot be told from one it crashed on, so
    # each request gets its own connection (~0.2 ms on loopback, where llama-server runs).
    pools_connections = False

    def __init__(self, config: BackendConfig):
        super().__init__(config)
        self._props: dict[str, Any] | None = None
        self._can_infill: bool | None = None

    async def props(self) -> dict[str, Any]:
        """/props changes only on restart: asked once."""
        if self._props is None:
            self._props = await self.http.call("GET", "/props", parse=json_object)
        return self._props

    async def health(self) -> bool:
        try:
            return (await self.http.call("GET", "/health", parse=json_object)).get("status") == "ok"
        except BackendError:
            return False

    async def concurrency(self) -> int:
        """The server's slot count; a server that is down at startup gets the default, so Velo still starts."""
        if self.config.max_concurrency:
            return self.config.max_concurrency
        try:
            return int((await self.props()).get("total_slots") or 4)
        except BackendError as e:
            log.warning("%s; assuming 4 slots", e.message)
            return 4

    async def context_length(self) -> int | None:
        """Tokens per slot (llama-server splits -c across its slots)."""
        return ((await self.props()).get("default_generation_settings") or {}).get("n_ctx")

    async def can_infill(self) -> bool:
        """Whether the model has fill-in-the-middle tokens: llama-server answers 501 on /infill otherwise."""
        if self._can_infill is None:
            try:
                await self.http.call("POST", "/infill", {"input_prefix": "", "input_suffix": "", "n_predict": 0})
                self._can_infill = True
            except Unsupported:
                self._can_infill = False
        return self._can_infill

    async def list_models(self) -> list[ModelInfo]:
        listing, props = await self.http.call("GET", "/v1/models", parse=json_object), await self.props()
        entries = listing.get("data") or [{"id": props.get("model_path", self.name)}]
        meta = entries[0].get("meta") or {}
        caps, template = ["completion"], props.get("chat_template", "")
        if (props.get("chat_template_caps") or {}).get("supports_tools"):
            caps.append("tools")
        if "<think>" in template or "enable_thinking" in template:
            caps.append("thinking")
        if await self.can_infill():
            caps.append("insert")
        names = self.config.models or [gguf_name(e["id"]) for e in entries]
        params = meta.get("n_params", 0)
        path = props.get("model_path", "")
        file = model_file(path) if os.path.isfile(path) else None  # llama-server runs on this machine
        dated = {"modified_at": file.modified_at, "digest": file.digest} if file else {}
        return [ModelInfo(name=n, backend=self.name, size=meta.get("size", 0), format="gguf", **dated,
                          quantization_level=props.get("model_ftype", ""),
                          parameter_size=parameter_size(params),
                          context_length=await self.context_length(), capabilities=list(caps),
                          template=template,
                          model_info={"general.parameter_count": params, "n_ctx_train": meta.get("n_ctx_train")})
                for n in names]

    def chat_body(self, req: ChatRequest) -> dict[str, Any]:
        """The OpenAI body plus llama-server's own sampling keys (repeat_penalty, typical_p, mirostat, ...)."""
        native = native_sampling(req.options)
        native.pop("n_predict", None)
        native.pop("n_probs", None)
        return {**native, **super().chat_body(req)}

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        if req.suffix is None and not req.raw:
            return super().complete(req)
        stream = self._native("/infill" if req.suffix is not None else "/completion", req)
        return stream if req.stream else one_answer(stream)

    async def _native(self, path: str, req: CompletionRequest) -> AsyncIterator[Chunk]:
        """Always a stream from the server, whatever the client asked (see adapters/http.py)."""
        body, cfg = native_body(replace(req, stream=True)), self.config
        async with self.http.request("POST", path, body, wait=cfg.first_token_timeout, model=req.model) as resp:
            async for chunk in self.http.sse(resp, first_wait=cfg.first_token_timeout, total=cfg.total_timeout,
                                             parse=native_chunk):
                yield chunk
                if chunk.finish_reason:
                    return
        raise BackendError(f"backend {self.name!r} ended the {path} stream before it stopped")

    async def count_tokens(self, req: ChatRequest | CompletionRequest) -> int | None:
        """A chat rendered by the server's own template (`/apply-template`), then tokenized; a raw prompt as is."""
        if isinstance(req, CompletionRequest) and not req.raw:
            req = as_chat(req)
        if isinstance(req, CompletionRequest):
            return len(await self.tokenize(req.prompt + (req.suffix or "")))
        rendered = await self.http.call("POST", "/apply-template", self.chat_body(req), model=req.model,
                                        parse=lambda obj: wire_text(obj["prompt"]))
        return len(await self.tokenize(rendered))

    async def tokenize(self, text: str) -> list[int]:
        """Prompt token counts for the proxy (context-length checks) without generating anything."""
        return await self.http.call("POST", "/tokenize", {"content": text}, parse=lambda obj: list(obj["tokens"]))
