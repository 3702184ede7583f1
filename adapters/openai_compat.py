"""Any OpenAI-compatible server (vLLM, SGLang, LM Studio, Ollama's /v1, llama-server): chat and completions
with streaming, tools, response_format, embeddings and /v1/models; an optional API key goes out as Bearer."""
from __future__ import annotations

import logging
from contextlib import aclosing
from dataclasses import replace
from typing import Any, AsyncIterator

from . import embed_shape, go_template, model_card
from .base import Backend, BackendConfig
from .errors import BackendError, BadRequest, VeloError
from .http import Upstream, asked_of
from .openai_wire import (ChatStream, alternatives, as_stream_event, chat_to_wire, completion_to_wire,
                          embeddings_from_wire)
from .protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, Message, ModelInfo,
                       rfc3339)

log = logging.getLogger("velo.adapters.openai_compat")


def as_chat(req: CompletionRequest) -> ChatRequest:
    """Ollama's non-raw /api/generate applies the model's chat template: on OpenAI servers that is a chat."""
    messages = [Message(role="system", content=req.system)] if req.system else []
    messages.append(Message(role="user", content=req.prompt, images=req.images))
    return ChatRequest(model=req.model, messages=messages, options=req.options, format=req.format,
                       stream=req.stream, keep_alive=req.keep_alive, think=req.think,
                       splits_thinking=req.splits_thinking, n=req.n, prefix_scope=req.prefix_scope)


def _go_rendered(req: CompletionRequest) -> CompletionRequest:
    """Ollama's template override: the prompt its Go `template` renders, sent (and so counted) raw."""
    if req.template is None or req.raw:
        return req
    prompt = go_template.render_request(req)
    return replace(req, prompt=prompt, raw=True, suffix=None, system=None, template=None)


_ASSUMED = ("completion", "tools", "thinking")
# /v1/models `owned_by` -> the product, for servers known to name themselves there (vLLM's and SGLang's
# ModelCard default it). Both continue a prefilled assistant turn when asked (`continue_final_message`); OpenAI's
# own API refuses unknown fields, so only a server that said who it is gets that field.
OWNERS = {"vllm": "vLLM", "sglang": "SGLang"}
# the fields of a chat that vLLM's /tokenize renders as /v1/chat/completions does (its TokenizeChatRequest)
_TOKENIZED = ("model", "messages", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")


def _created(model: dict[str, Any]) -> dict[str, str]:
    """A listed model's `created` (Unix seconds) as ModelInfo's `modified_at`, when the server gives a sane one."""
    created = model.get("created")
    return {"modified_at": rfc3339(created)} if isinstance(created, (int, float)) and 0 < created < 2**33 else {}


class OpenAIBackend(Backend):
    pools_connections = True
    knows_capabilities = False  # _ASSUMED: suffix and images go to the server, which answers for itself

    def __init__(self, config: BackendConfig):
        super().__init__(config)
        # Users copy base URLs with or without the /v1 that OpenAI SDKs expect; the paths below add it.
        self.http = Upstream(replace(config, urls=[u.rstrip("/").removesuffix("/v1") for u in config.urls]),
                             pooled=self.pools_connections)
        self.server: str | None = None  # "vllm" or "sglang" where the last listing named one as its owner
        self.salts = True  # False once the server refused `cache_salt` (vLLM on its V0 engine)

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
        themselves, and answer in their own words when a model cannot. vLLM lists each model's context."""
        if self.config.models:
            return [self._info({"id": m}) for m in self.config.models]
        return await self.http.call("GET", "/v1/models", parse=self._listed)

    def _listed(self, listing: dict[str, Any]) -> list[ModelInfo]:
        models = listing.get("data", [])
        self.server = next((m["owned_by"] for m in models if isinstance(m, dict) and m.get("owned_by") in OWNERS),
                           None)
        return [self._info(m) for m in models]

    @property
    def continues_prefill(self) -> bool:
        return self.server is not None

    @property
    def refuses_output_past_window(self) -> bool:  # type: ignore[override]
        return self.server is not None

    @property
    def forces_tool_choice(self) -> bool:  # type: ignore[override]
        """vLLM and SGLang force a required or named call with guided decoding; llama-server's /v1 answered
        `tool_choice: "required"` in prose (and Ollama's has no tool_choice), so any other server gets the call's
        schema as its output format instead (proxy/tools/offer.py)."""
        return self.server is not None

    def _info(self, listed: dict[str, Any]) -> ModelInfo:
        context = listed.get("max_model_len")  # vLLM's field; other servers list no context
        context = context if isinstance(context, int) and context > 0 else None
        return ModelInfo(name=str(listed["id"]), backend=self.name, capabilities=list(_ASSUMED),
                         context_length=context, template=model_card.PLAIN,
                         parameters=model_card.parameters(context, []), **_created(listed))

    def chat_body(self, req: ChatRequest) -> dict[str, Any]:
        """A prefilled chat (one ending in an assistant turn) on vLLM or SGLang is continued, not answered by a new
        turn after it: their templates close the last message and open another unless told otherwise. vLLM also
        wants its generation prompt off (it refuses both together); SGLang's request has no such field, and appends
        the turn after the generation prompt itself."""
        body = chat_to_wire(req)
        if self.continues_prefill and req.prefill:
            body["continue_final_message"] = True
            if self.server == "vllm":
                body["add_generation_prompt"] = False
        return self._salted(body, req)

    def _salted(self, body: dict[str, Any], req: ChatRequest | CompletionRequest) -> dict[str, Any]:
        """vLLM (0.9+) keeps a key's prompt prefixes apart from another's under `cache_salt`, as Velo's engine does
        under the request's prefix_scope; other servers have no such field."""
        if self.server == "vllm" and req.prefix_scope and self.salts:
            body["cache_salt"] = req.prefix_scope
        return body

    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        stream = self._answer("/v1/chat/completions", self.chat_body(self.asked_chat(req)), req.model, req.stream)
        return alternatives(stream, req.options)

    def asked_chat(self, req: ChatRequest) -> ChatRequest:
        """The chat as this server is asked it: streamed unless configured otherwise (adapters/http.py)."""
        return asked_of(req, self.config)

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        req = _go_rendered(req)
        if not req.raw and req.suffix is None:
            return self.chat(as_chat(req))
        body = self._salted(completion_to_wire(asked_of(req, self.config)), req)
        return alternatives(self._answer("/v1/completions", body, req.model, req.stream), req.options)

    @staticmethod
    def reports_progress(event: Any) -> bool:
        """Whether a streamed event only reports progress through the prompt (none do in the OpenAI API)."""
        return False

    async def _answer(self, path: str, body: dict[str, Any], model: str, streams: bool) -> AsyncIterator[Chunk]:
        """A stream from the backend, or (not `streams`) its one answer, folded by the parser as the events come
        (see adapters/http.py `one_answer`, which each event went through as a Chunk). An event with nothing to send
        yet (llama-server's prompt progress, a tool call's argument pieces) sends nothing. A vLLM on its V0 engine
        refuses `cache_salt` (a 400 naming it; every request with a key failed): the request goes again without
        it, as do those after it."""
        while True:
            parser, sent = ChatStream(whole=not streams), False
            try:
                async with aclosing(self.http.generation(path, body, model=model, parse=parser.feed,
                                                         whole=lambda answer: parser.feed(as_stream_event(answer)),
                                                         progress=self.reports_progress)) as events:
                    async for chunk in events:
                        sent = True
                        yield chunk
                break
            except BadRequest as e:
                if sent or "cache_salt" not in body or "cache_salt" not in e.message:
                    raise
                log.warning("backend %r refuses cache_salt (vLLM's V0 engine): keys share its prefix cache", self.name)
                self.salts, body = False, {k: v for k, v in body.items() if k != "cache_salt"}
        if parser.finish is None:
            raise BackendError(f"backend {self.name!r} ended the {path} stream before its finish_reason")
        yield parser.last()

    async def count_tokens(self, req: ChatRequest | CompletionRequest) -> int | None:
        """vLLM's own count (`/tokenize`): a chat as its template renders it, tools and template variables included,
        where the estimate of 4 characters a token is off by up to a quarter either way. Other OpenAI-compatible
        servers cannot say, and a vLLM that fails to leaves the estimate."""
        if self.server != "vllm":
            return None
        if isinstance(req, CompletionRequest):
            req = _go_rendered(req)
        if isinstance(req, CompletionRequest) and not req.raw and req.suffix is None:
            req = as_chat(req)
        if isinstance(req, CompletionRequest):
            body: dict[str, Any] = {"model": req.model, "prompt": req.prompt}
        else:
            wire = self.chat_body(req)
            body = {k: wire[k] for k in _TOKENIZED if k in wire}
        try:
            return await self.http.call("POST", "/tokenize", body, model=req.model, parse=lambda obj: int(obj["count"]),
                                        wait=self.config.first_token_timeout)
        except VeloError:  # an older vLLM without /tokenize, a model it cannot render
            return None

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        """`dimensions` is the server's to do, and done here where it gave more (llama-server ignores it:
        576 values came back for 4), as Ollama does it."""
        body: dict[str, Any] = {"model": req.model, "input": req.inputs, "encoding_format": "float"}
        if req.dimensions is not None:
            body["dimensions"] = req.dimensions
        result = await self.embed_body(body, req.model)
        result.embeddings = embed_shape.shorten(result.embeddings, req.dimensions)
        return result

    async def embed_body(self, body: dict[str, Any], model: str) -> EmbedResult:
        return await self.http.call("POST", "/v1/embeddings", body, model=model, parse=embeddings_from_wire,
                                    wait=self.http.embedding_wait(len(body["input"])))
