"""Any OpenAI-compatible server (vLLM, SGLang, LM Studio, Ollama's /v1, llama-server): chat and completions
with streaming, tools, response_format, embeddings and /v1/models; an optional API key goes out as Bearer."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, AsyncIterator

from .base import Backend, BackendConfig
from .errors import BackendError
from .http import Upstream, one_answer
from .openai_wire import ChatStream, chat_to_wire, completion_to_wire, embeddings_from_wire
from .protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, Message, ModelInfo,
                       rfc3339)


def as_chat(req: CompletionRequest) -> ChatRequest:
    """Ollama's non-raw /api/generate applies the model's chat template: on OpenAI servers that is a chat."""
    messages = [Message(role="system", content=req.system)] if req.system else []
    messages.append(Message(role="user", content=req.prompt, images=req.images))
    return ChatRequest(model=req.model, messages=messages, options=req.options, format=req.format,
                       stream=req.stream, keep_alive=req.keep_alive, think=req.think, n=req.n)


_ASSUMED = ("completion", "tools", "thinking")


def _created(model: dict[str, Any]) -> dict[str, str]:
    """A listed model's `created` (Unix seconds) as ModelInfo's `modified_at`, when the server gives a sane one."""
    created = model.get("created")
    return {"modified_at": rfc3339(created)} if isinstance(created, (int, float)) and 0 < created < 2**33 else {}


class OpenAIBackend(Backend):
    forces_tool_choice = True  # vLLM and SGLang force calls with guided decoding
    pools_connections = True

    def __init__(self, config: BackendConfig):
        super().__init__(config)
        # Users copy base URLs with or without the /v1 that OpenAI SDKs expect; the paths below add it.
        self.http = Upstream(replace(config, urls=[u.rstrip("/").removesuffix("/v1") for u in config.urls]),
                             pooled=self.pools_connections)

    async def close(self) -> None:
        await self.http.close()

    async def health(self) -> bool:
        try:
            await self.http.call("GET", "/v1/models")
        except BackendError:
            return False
        return True

    async def list_models(self) -> list[ModelInfo]:
        """The OpenAI API cannot say what a model supports: vLLM and SGLang parse tool calls and thinking
        themselves, and answer in their own words when a model cannot."""
        if self.config.models:
            return [ModelInfo(name=m, backend=self.name, capabilities=list(_ASSUMED)) for m in self.config.models]
        return await self.http.call("GET", "/v1/models", parse=self._listed)

    def _listed(self, listing: dict[str, Any]) -> list[ModelInfo]:
        return [ModelInfo(name=str(m["id"]), backend=self.name, capabilities=list(_ASSUMED), **_created(m))
                for m in listing.get("data", [])]

    def chat_body(self, req: ChatRequest) -> dict[str, Any]:
        return chat_to_wire(req)

    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        stream = self._answer("/v1/chat/completions", self.chat_body(replace(req, stream=True)), req.model)
        return stream if req.stream else one_answer(stream)

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        if not req.raw and req.suffix is None:
            return self.chat(as_chat(req))
        stream = self._answer("/v1/completions", completion_to_wire(replace(req, stream=True)), req.model)
        return stream if req.stream else one_answer(stream)

    async def _answer(self, path: str, body: dict[str, Any], model: str) -> AsyncIterator[Chunk]:
        """Always a stream from the backend, whatever the client asked (see adapters/http.py)."""
        cfg, parser = self.config, ChatStream()
        async with self.http.request("POST", path, body, wait=cfg.first_token_timeout, model=model) as resp:
            async for chunk in self.http.sse(resp, first_wait=cfg.first_token_timeout, total=cfg.total_timeout,
                                             parse=parser.feed):
                if chunk is not None:
                    yield chunk
        if parser.finish is None:
            raise BackendError(f"backend {self.name!r} ended the {path} stream before its finish_reason")
        yield parser.last()

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        body: dict[str, Any] = {"model": req.model, "input": req.inputs, "encoding_format": "float"}
        if req.dimensions is not None:
            body["dimensions"] = req.dimensions
        return await self.http.call("POST", "/v1/embeddings", body, model=req.model, parse=embeddings_from_wire)
