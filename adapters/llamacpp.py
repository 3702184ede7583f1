"""llama.cpp's llama-server: chat and embeddings through its OpenAI-compatible routes (shared with
openai_compat), raw completion through native `/completion` (cache_prompt, n_predict, json_schema, n_probs),
fill-in-the-middle through `/infill`, and the server's own facts from `/props`, `/v1/models` and `/health`."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from dataclasses import replace
from typing import Any, AsyncIterator
from urllib.parse import quote

import orjson

from engine.fim import FIM_MARKERS

from . import embed_shape, go_template, model_card, options
from .base import IMAGE_TOKENS, BackendConfig
from .chat_template import renders_tools
from .errors import (Answered, BackendError, BackendTimeout, BadRequest, ContextOverflow, ModelLacks, Unsupported,
                     VeloError)
from .fields import wire_text
from .http import BODY_UNREAD, LOADING_POLL_S, asked_of, json_object, one_answer
from .model_file import model_file
from .openai_compat import OpenAIBackend, as_chat
from .openai_wire import alternatives
from .protocol import (IMAGE_TAG, ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, Message,
                       ModelInfo, RunningModel, SamplingOptions, TokenLogprob, Usage, images_in, places_images,
                       prompt_read, reads_tags)
from .think import ThinkSplitter, opens_thinking, template_thinks

log = logging.getLogger("velo.adapters.llamacpp")

# llama-server samples with top_k 40, top_p 0.95 and min_p 0.05 where a request sets none (common/common.h): a
# truncation the request leaves unset is off here, as on the engine and in the OpenAI and Anthropic APIs (the Ollama
# dialect fills in Ollama's own values, which come first).
_UNSET_IS_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}


# llama-server's own sampler keys that the options table has no row for (tools/server/README.md): a client's pass
# on to it in `extra`, as Ollama's option names do (other backends leave `extra` out or ignore it).
NATIVE_SAMPLERS = frozenset({"dynatemp_range", "dynatemp_exponent", "top_n_sigma", "xtc_probability",
                             "xtc_threshold", "dry_multiplier", "dry_base", "dry_allowed_length",
                             "dry_penalty_last_n", "dry_sequence_breakers", "min_keep", "samplers"})


# llama-server embeds no input longer than its physical batch (-ub, 512 by default), even under its context, and
# answers 500 (tools/server/server-context.cpp); Velo cuts the inputs to it, as Ollama cuts them to the context.
_TOO_LARGE = re.compile(r"is too large to process\. increase the physical batch size \(current batch size: (\d+)\)")


def _batch_limit(message: str) -> int | None:
    found = _TOO_LARGE.search(message)
    return int(found.group(1)) if found else None


def _embedded_at_most(e: VeloError, truncate: bool) -> int:
    """The tokens an embedding input is cut to after `e`, its BOS and EOS or SEP included, as Ollama cuts them (its
    EmbedHandler): a slot's context less two (an input of the whole context was refused by a last-token pooled
    model), or the physical batch. `e` itself where it says neither; where `truncate` is false, Ollama's
    words and status, and the way out."""
    if isinstance(e, ContextOverflow):
        limit = max(e.limit - 2, 1)
    elif (batch := _batch_limit(e.message)) is not None:
        limit = batch
    else:
        raise e
    if not truncate:
        why = "" if isinstance(e, ContextOverflow) else (
            f" (this llama-server embeds at most {limit} tokens an input, its physical batch: start it with -ub and -b"
            " as large as its context)")
        raise BadRequest(f"the input length exceeds the context length{why}") from e
    return limit


def capabilities(jinja: str, tools: bool, infill: bool, sees: bool = False) -> list[str]:
    """Ollama's capability names for a llama-server model: its template's (tools, thinking), /infill's, and `sees`
    (/props `modalities.vision`: a projector loaded with --mmproj). A chat splits thinking in llama-server's own
    parsers, which read more markers than <think> (Command R7B's, Gemma 4's), so a template with a thinking switch
    thinks there."""
    thinks = template_thinks(jinja) or "enable_thinking" in jinja
    return (["completion"] + (["tools"] if tools else []) + (["thinking"] if thinks else [])
            + (["insert"] if infill else []) + (["vision"] if sees else []))


def _is_router(props: dict[str, Any]) -> bool:
    """A llama-server in router mode (`--models-dir`, `--models-preset`): many models, each loaded on demand in a
    server of its own, picked by each request's `model`."""
    return props.get("role") == "router"


def _status(entry: dict[str, Any]) -> dict[str, Any]:
    """A router's word on one model: `value` (loaded, loading, unloaded, ...), its command line `args`, `failed`."""
    return entry.get("status") or {}


def _sees(entry: dict[str, Any]) -> bool:
    """A router's word on whether one model reads images: its `architecture.input_modalities`, from the projector
    its command line names (server-models.cpp), known without loading it."""
    return "image" in ((entry.get("architecture") or {}).get("input_modalities") or [])


def _model_file(entry: dict[str, Any]) -> str:
    """The model file a router's entry runs, from its command line."""
    return flag_value(_status(entry).get("args") or [], "-m", "--model") or ""


def flag_value(args: list[str], *names: str) -> str | None:
    """The value after the first of `names` in a command line."""
    for flag, value in zip(args, args[1:]):
        if flag in names:
            return value
    return None


# The client's options, beyond the table's, that are llama-server's sampler keys. Ollama's dialect passes on every
# key it does not know (Ollama ignores them), and they went into the body whole: `grammar` constrained the answer,
# `n_probs` added logprobs, `stream` overrode Velo's own.
_EXTRAS = NATIVE_SAMPLERS | {"mirostat", "mirostat_tau", "mirostat_eta"}
_INT32 = 2**31 - 1
_LONGEST_WINDOW = 2**17  # tokens: the longest context of the models here (Qwen2.5's 128k), a 512 KB buffer


def llama_reads(o: SamplingOptions, window: int | None) -> SamplingOptions:
    """The knobs as llama-server can take them. Its integers are 32-bit: a limit of 4294967299 tokens wrapped to 3,
    and 10**12 was its 400 naming -727379968, so a larger limit is its largest and a larger top_k is off (both keep
    every token). Its repeat_last_n has no -1 (Ollama's "the whole context"; a 400) and sizes a buffer (an int32's
    worth of tokens is 8 GB): the slot's `window` bounds it, or before /props was asked, `_LONGEST_WINDOW`."""
    changes: dict[str, Any] = {}
    if o.max_tokens is not None and o.max_tokens > _INT32:
        changes["max_tokens"] = _INT32
    if o.top_k is not None and o.top_k > _INT32:
        changes["top_k"] = 0
    limit = window or _LONGEST_WINDOW
    if o.repeat_last_n is not None and not 0 <= o.repeat_last_n <= limit:
        changes["repeat_last_n"] = limit
    return replace(o, **changes) if changes else o


def native_sampling(o: SamplingOptions) -> dict[str, Any]:
    """The llama-server sampler keys among the client's `extra` (Ollama option names such as mirostat) first."""
    out = {**_UNSET_IS_OFF, **{k: v for k, v in o.extra.items() if k in _EXTRAS}, **options.write("llamacpp", o)}
    if o.logprobs:
        out["n_probs"] = o.top_logprobs or 1
    return out


def _sent_as_is(req: CompletionRequest) -> bool:
    """Whether the prompt goes to /completion or /infill as written (raw, or a fill-in-the-middle without a template
    of the client's) rather than in the chat template: how it is sent is how its tokens are counted."""
    return req.raw or (req.template is None and req.suffix is not None)


def native_body(req: CompletionRequest) -> dict[str, Any]:
    """A /completion or /infill body; `model` picks a router's model (a single-model server ignores it)."""
    body = {"model": req.model, "stream": req.stream, "cache_prompt": True, **native_sampling(req.options)}
    if req.format is not None:
        body["json_schema"] = {"type": "object"} if req.format == "json" else req.format
    if req.suffix is not None:
        body.update(input_prefix=req.prompt, input_suffix=req.suffix)
    else:  # token ids go as they are: llama-server adds no BOS to them (tokenize_input_subprompt)
        body["prompt"] = req.prompt if req.prompt_ids is None else req.prompt_ids
    return body


def _is_progress(event: Any) -> bool:
    """llama-server's `return_progress` events: one as a prompt starts, one per batch of it (`-b`, 2048 tokens)."""
    return isinstance(event, dict) and "prompt_progress" in event


def native_chunk(obj: dict[str, Any]) -> Chunk:
    """One `/completion` or `/infill` event; the last has `stop: true` and the counts. A progress report says
    nothing of the answer (its `tokens` hold a placeholder 0)."""
    if _is_progress(obj):
        return Chunk()
    chunk = Chunk(text=wire_text(obj.get("content")), context=obj.get("tokens") or None, logprobs=[
        TokenLogprob.from_wire(p) for p in obj.get("completion_probabilities") or [] if "logprob" in p])
    if obj.get("stop"):
        timings = obj.get("timings") or {}
        chunk.finish_reason = "length" if obj.get("stop_type") == "limit" else "stop"
        chunk.usage = Usage(prompt_tokens=obj.get("tokens_evaluated", 0),
                            completion_tokens=obj.get("tokens_predicted", 0),
                            cached_tokens=timings.get("cache_n", 0),
                            prompt_eval_ns=int(timings.get("prompt_ms", 0) * 1e6),
                            eval_ns=int(timings.get("predicted_ms", 0) * 1e6))  # no total: usage_from_wire
    return chunk


def _with_progress(body: dict[str, Any]) -> dict[str, Any]:
    """A streamed body asks for llama-server's progress through the prompt, which keeps the first-token wait going
    (adapters/http.py): on a CPU a long prompt takes minutes before its first token (Qwen2.5-Coder-1.5B read a
    12,307-token prompt in 310 s on this 2-core machine, 40 tokens/s; Claude Code's first request is ~20k)."""
    return {**body, "return_progress": True} if body.get("stream") else body


# llama-server's answers to a request it cannot do (format_error_response in tools/server/server-common.cpp):
# invalid request (an overflow too), a failure on it, a feature it was started without. Not its 401 (Velo's key to
# it, not the client's) nor its 404 (a replica without the model: the next one is asked).
_ITS_ERRORS = (400, 500, 501)


def _unread_as_400(e: Answered) -> Answered:
    """A request llama-server could not read as the 400 `invalid_request_error` in its own shape, which it answers
    for other bad requests: a 5xx is the server's fault, which clients and proxies retry."""
    error = {"code": 400, "message": e.message, "type": "invalid_request_error"}
    return Answered(400, orjson.dumps({"error": error}), e.message)


def _finishes(chunk: Chunk) -> bool:
    return chunk.finish_reason is not None


async def _without_echo(prefix: str, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """`chunks` with `prefix` taken off the front of their text where it starts with it (llama-server streams it
    joined to the first token: "Hello, welcome")."""
    held = ""
    async with contextlib.aclosing(chunks) as stream:
        async for chunk in stream:
            if prefix and (chunk.text or chunk.finish_reason is not None):
                held += chunk.text
                if len(held) < len(prefix) and prefix.startswith(held) and chunk.finish_reason is None:
                    continue  # it may still be the echo
                chunk, prefix = replace(chunk, text=held.removeprefix(prefix)), ""
            yield chunk


def _no_empty_prefill(messages: list[Message]) -> list[Message]:
    """The chat without an empty assistant turn at its end, which prefills nothing (Anthropic's API allows one and
    answers as without it): llama-server cut the prompt before that turn, its generation prompt too, and the model
    wrote the turn's header ("assistant") at the start of its answer."""
    return messages[:-1] if messages and messages[-1].empty_assistant else messages


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
    knows_capabilities = True  # /props and /infill tell
    answers_unlisted_names = True  # a single-model server answers any `model` with its one

    reports_progress = staticmethod(_is_progress)

    def __init__(self, config: BackendConfig):
        super().__init__(config)
        self._props: dict[str, Any] | None = None
        self._can_infill: bool | None = None
        self._gguf: dict[str, asyncio.Future] = {}  # model path -> the reading of its GGUF facts

    async def props(self) -> dict[str, Any]:
        """/props changes only on restart: asked once here, and again with each listing (`_props_now`)."""
        if self._props is None:
            self._props = await self.http.call("GET", "/props", parse=json_object, wait=self.config.first_token_timeout)
        return self._props

    def _window(self) -> int | None:
        """Tokens per slot, as /props last said (None before it was asked)."""
        return ((self._props or {}).get("default_generation_settings") or {}).get("n_ctx")

    async def _props_now(self) -> dict[str, Any]:
        """/props asked again, so a server restarted with another model or context is described as it is now (its
        window checked, its fill-in-the-middle asked again); before, the first answer held until Velo restarted."""
        props = await self.http.call("GET", "/props", parse=json_object)
        if self._props is not None and props.get("model_path") != self._props.get("model_path"):
            self._can_infill = None
        self._props = props
        return props

    async def health(self) -> bool:
        try:
            return (await self.http.call("GET", "/health", parse=json_object)).get("status") == "ok"
        except BackendError:
            return False

    async def concurrency(self) -> int:
        """The server's slot count; BackendError from a server that is down (the admit stage then assumes 4 and
        asks again until it says)."""
        if self.config.max_concurrency:
            return self.config.max_concurrency
        return int((await self.props()).get("total_slots") or 4)

    async def context_length(self) -> int | None:
        """Tokens per slot (llama-server splits -c across its slots)."""
        await self.props()
        return self._window()

    async def can_infill(self) -> bool:
        """Whether the model has fill-in-the-middle tokens: llama-server answers 501 on /infill otherwise."""
        if self._can_infill is None:
            try:
                await self.http.call("POST", "/infill", {"input_prefix": "", "input_suffix": "", "n_predict": 0})
                self._can_infill = True
            except Unsupported:
                self._can_infill = False
        return self._can_infill

    async def _entries(self) -> list[dict[str, Any]]:
        """/v1/models' entries: a router's hold each model's `status`."""
        return (await self.http.call("GET", "/v1/models", parse=json_object)).get("data") or []

    async def list_models(self) -> list[ModelInfo]:
        entries, props = await self._entries(), await self._props_now()
        if _is_router(props):
            return await self._routed(entries)
        entries = entries or [{"id": props.get("model_path", self.name)}]
        meta = entries[0].get("meta") or {}
        jinja, infill = props.get("chat_template", ""), await self.can_infill()
        caps = capabilities(jinja, bool((props.get("chat_template_caps") or {}).get("supports_tools")), infill,
                            bool((props.get("modalities") or {}).get("vision")))
        names = self.config.models or [gguf_name(e["id"]) for e in entries]
        params, context = meta.get("n_params", 0), await self.context_length()
        path = props.get("model_path", "")
        file = model_file(path) if os.path.isfile(path) else None  # llama-server runs on this machine
        dated = {"modified_at": file.modified_at, "digest": file.digest} if file else {}
        # the family /api/show gives it (Roo Code reads /api/tags' details, which Ollama fills from the same file)
        family = str((await self.gguf_facts(path)).info.get("general.architecture", "")) if file else ""
        # llama-server writes the FIM prompt itself (/infill): the template's tokens only document it, and tell
        # clients that FIM works; until the file says which (show), StarCoder's, which llama.cpp also recognises.
        fim = FIM_MARKERS[1] if infill else None
        own = [n for n in (props.get("model_alias"), path, *(e["id"] for e in entries)) if n and n not in names]
        return [ModelInfo(name=n, backend=self.name, size=meta.get("size", 0), format="gguf", family=family, **dated,
                          served_as=list(dict.fromkeys(own)),
                          quantization_level=props.get("model_ftype", ""),
                          parameter_size=parameter_size(params), context_length=context, capabilities=list(caps),
                          template=model_card.go_template(jinja, fim),
                          parameters=model_card.parameters(context, model_card.stop_words(jinja)),
                          model_info={"general.parameter_count": params})
                for n in names]

    async def _routed(self, entries: list[dict[str, Any]]) -> list[ModelInfo]:
        """A router's models (`--models-dir`, `--models-preset`), each from the file and context its command line
        names: asking the router for a model's /props would load it."""
        out = []
        for entry in entries:
            context = flag_value(_status(entry).get("args") or [], "-c", "--ctx-size") or ""
            out.append(await self.file_listing(str(entry["id"]), _model_file(entry),
                                               int(context) or None if context.isdigit() else None, _sees(entry)))
        return out

    async def show(self, model: str, verbose: bool = False) -> ModelInfo:
        """The listing's facts, plus the model file's own metadata where the file is on this machine."""
        props, info = await self.props(), await super().show(model)
        if _is_router(props):
            return await self.with_file(info, info.file, "", verbose)
        return await self.with_file(info, props.get("model_path", ""), props.get("chat_template", ""), verbose)

    async def running(self) -> list[RunningModel]:
        """A router's loaded models; a single-model server's one."""
        if not _is_router(await self.props()):
            return await super().running()
        loaded = [e for e in await self._entries() if _status(e).get("value") == "loaded"]
        return [RunningModel(name=m.name, size=m.size, digest=m.digest, info=m) for m in await self._routed(loaded)]

    async def load(self, model: str, keep: Any) -> int:
        """A router loads the model when asked (Ollama's bare load request), and the request waits until it has, up
        to `first_token_timeout`: the nanoseconds that took. A single-model server has its one model loaded."""
        if not _is_router(await self.props()):
            return await super().load(model, keep)
        start, until = time.perf_counter_ns(), time.monotonic() + self.config.first_token_timeout
        with contextlib.suppress(BadRequest):  # "model is already running": loaded, or loading for another request
            await self.http.call("POST", "/models/load", {"model": model}, model=model)
        while True:
            status = next((_status(e) for e in await self._entries() if e.get("id") == model), {})
            if status.get("value") == "loaded":
                return time.perf_counter_ns() - start
            if status.get("failed"):
                raise BackendError(f"backend {self.name!r} could not load {model!r} (its server exited with "
                                   f"{status.get('exit_code')})")
            if time.monotonic() + LOADING_POLL_S > until:
                raise BackendTimeout(f"backend {self.name!r} did not load {model!r} within "
                                     f"{self.config.first_token_timeout:g}s")
            await asyncio.sleep(LOADING_POLL_S)

    async def unload(self, model: str) -> None:
        """A router unloads a model when asked (Ollama's `keep_alive: 0`); one that is not loaded stays so."""
        if _is_router(await self.props()):
            with contextlib.suppress(BadRequest):
                await self.http.call("POST", "/models/unload", {"model": model}, model=model)

    async def with_file(self, info: ModelInfo, path: str, jinja: str, verbose: bool = False) -> ModelInfo:
        """`verbose`: the file's long arrays whole, as Ollama's /api/show gives them (read for this request only)."""
        if not os.path.isfile(path):
            return info
        facts = await self.gguf_facts(path)
        info.file = path
        whole = await asyncio.to_thread(model_card.verbose_info, path) if verbose else facts.info
        info.model_info = whole | info.model_info
        info.shown = {**info.shown, "tensors": facts.tensors}
        if facts.fim and "insert" in info.capabilities:
            info.template = model_card.go_template(jinja or facts.jinja, facts.fim)
        return info

    async def gguf_facts(self, path: str) -> model_card.GgufFacts:
        """Read once per file, off the event loop, by a task that a caller who gives up (a timed-out model lookup)
        does not cancel: 0.13 s for SmolLM2's header, 0.27 s for Qwen2.5-Coder's 151k-token vocabulary, idle."""
        if path not in self._gguf:
            self._gguf[path] = asyncio.ensure_future(asyncio.to_thread(model_card.gguf_facts, path))
        return await asyncio.shield(self._gguf[path])

    async def file_listing(self, name: str, path: str, context: int | None, sees: bool = False) -> ModelInfo:
        """A model as its GGUF file tells it (template, stop words, fill-in-the-middle), for a server that cannot be
        asked without loading the model (a stopped managed server, a router's unloaded model); `sees` where the
        server says it has a projector (the file cannot)."""
        bare = ModelInfo(name=name, backend=self.name, format="gguf", capabilities=capabilities("", False, False, sees))
        if not os.path.isfile(path):
            return bare
        try:
            facts = await self.gguf_facts(path)
        except Exception:  # noqa: BLE001 - no GGUF (a text file so named): listed bare, its server's start says why
            return bare  # unlisted, its name went to the default backend, and another model answered for it
        file = model_file(path)
        return ModelInfo(name=name, backend=self.name, format="gguf", modified_at=file.modified_at,
                         digest=file.digest, size=file.size, context_length=context, file=path,
                         family=str(facts.info.get("general.architecture", "")),
                         capabilities=capabilities(facts.jinja, renders_tools(facts.jinja), facts.fim is not None,
                                                   sees),
                         template=model_card.go_template(facts.jinja, facts.fim),
                         parameters=model_card.parameters(context, model_card.stop_words(facts.jinja)))

    async def native(self, method: str, path: str, body: dict[str, Any] | None) -> AsyncIterator[bytes]:
        """llama-server's own routes (`/infill`, `/tokenize`, `/props`, ...), answered as it answers them, for
        clients of its API (llama.vscode's autocomplete sends `input_extra` and its own samplers, which no dialect
        carries). `path` keeps its query (`/slots/0?action=save`). Its errors of the request itself come as it
        answers them; one of a server that is down or busy (a 503, a 429) is Velo's, which a replica set fails over.
        An answer not streamed comes whole, its first byte after its last token: it has `total_timeout`, as a
        generation asked whole has (Upstream.call); cut at `first_token_timeout`, a long one was a 504."""
        cfg = self.config
        wait = cfg.first_token_timeout if body is not None and body.get("stream") else cfg.total_timeout
        try:
            async with self.http.request(method, path, body, wait=wait, as_is=_ITS_ERRORS) as resp:
                async for piece in self.http.reads(resp, wait, cfg.total_timeout):
                    yield piece
        except Answered as e:
            if e.status != 500 or not e.message.startswith(BODY_UNREAD):
                raise
            raise _unread_as_400(e) from e

    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        """A prefilled chat (one ending in an assistant turn) is answered by llama-server with the whole assistant
        message, the prefill first (its parser reads the generation prompt with the text): only what the model
        added comes back, as from every other backend."""
        stream = super().chat(req)
        return _without_echo(req.prefill, stream) if req.prefill else stream

    def asked_chat(self, req: ChatRequest) -> ChatRequest:
        """llama-server refuses logprobs with tools on a stream ("logprobs is not supported with tools + stream"),
        which it answers whole: a client's one-answer request with both is asked whole, not streamed."""
        return req if not req.stream and req.tools and req.options.logprobs else super().asked_chat(req)

    def chat_body(self, req: ChatRequest) -> dict[str, Any]:
        """The OpenAI body plus llama-server's own sampling keys (repeat_penalty, typical_p, mirostat, ...)."""
        req = replace(req, options=llama_reads(req.options, self._window()), messages=_no_empty_prefill(req.messages))
        native = native_sampling(req.options)
        native.pop("n_predict", None)
        native.pop("n_probs", None)
        body = {**native, **super().chat_body(req)}
        if not req.splits_thinking:  # this request's parser leaves a <think> block in the content (server-common.cpp)
            body["reasoning_format"] = "none"
        if req.options.stop:  # which one ended the answer (Anthropic's stop_sequence): only a debug field says it
            body |= {"verbose": True, "response_fields": ["stopping_word"]}
        return _with_progress(body)

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        if req.raw and not req.prompt and req.prompt_ids is None and req.suffix is None:
            stream = self._new_document(req)
        elif places_images(req):
            stream = self._tagged(req)
        elif _sent_as_is(req):
            stream = self._native("/infill" if req.suffix is not None else "/completion", req)
        else:
            stream = self._with_context(req)
        stream = alternatives(stream, req.options)
        return stream if req.stream else one_answer(stream)

    async def _new_document(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        """An empty raw prompt starts a new document, as OpenAI's completions take one and the engine answers it: from
        the model's BOS, else its end-of-text token (llama-server reads their text as the special token). Sent as it
        was, llama-server evaluated nothing and answered nothing, which Velo passed on as an empty `stop`."""
        props = await self.props()
        start = props.get("bos_token") or props.get("eos_token") or ""
        async with contextlib.aclosing(self._native("/completion", replace(req, prompt=start))) as stream:
            async for chunk in stream:
                yield chunk

    async def _tagged(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        """A raw prompt's images, as Ollama's runner reads them: each "[img-N]" tag the server's marker, with the N-th
        image in `multimodal_data` for it (once per tag); an image no tag names is not read, and a tag naming none is
        Ollama's "invalid image index" (its runner's 500, the client's 400 here). Sent as text, every image was lost."""
        marker, images = await self._media_marker(req.model), []

        def placed(tag: re.Match[str]) -> str:
            if (n := int(tag[1])) >= len(req.images):
                raise BadRequest(f"invalid image index: {n}", param="prompt")
            images.append(req.images[n])
            return marker
        sent = {"prompt_string": IMAGE_TAG.sub(placed, req.prompt), "multimodal_data": images}
        async with contextlib.aclosing(self._native("/completion", req, sent)) as stream:
            async for chunk in stream:
                chunk.context = None  # a raw answer has none (Ollama's routes.go sets it only when not raw)
                yield chunk

    async def _with_context(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        """Ollama's non-raw /api/generate: the prompt rendered (by the client's Go `template`, else the server's own
        chat template), its tokens after an earlier answer's `context`, sent to /completion; the last chunk carries
        the conversation's token ids, as Ollama's does. A model that thinks has its <think> text split off here, where
        the request `splits_thinking`; one whose thinking only llama-server's chat parsers split (Command R7B's
        markers) cannot think here, and asked to is Ollama's 400, not its reasoning inside the answer."""
        marker = await self._media_marker(req.model) if req.images else ""
        prompt = await self._rendered(req, marker)
        # the conversation's ids leave the markers out: a later turn's context, as text, would hold them without images
        ids = (req.context or []) + await self.tokenize(prompt.replace(marker, "") if marker else prompt, req.model)
        said, jinja = list(ids), await self._template(req.model)  # after a POST: a load is over
        if req.think not in (None, False) and not template_thinks(jinja):
            raise ModelLacks(req.model, "thinking")
        thinking = ThinkSplitter(opens_thinking(prompt)) if req.splits_thinking and template_thinks(jinja) else None
        sent = await self._with_images(req, prompt) if req.images else ids
        async with contextlib.aclosing(self._native("/completion", req, sent)) as stream:
            async for chunk in stream:
                said += chunk.context or []
                chunk.context = said if chunk.finish_reason else None
                if thinking is not None:
                    thinking.split(chunk, bool(chunk.finish_reason))
                yield chunk

    async def _rendered(self, req: CompletionRequest, marker: str) -> str:
        """A generate's prompt as the model reads it, one `marker` per image: the chat template's /apply-template puts
        the server's marker where each image part is; a client's Go template gets them ahead of the prompt, where
        Ollama puts its "[img-N]" tags (server/routes.go)."""
        if req.template is not None:
            return go_template.render_request(req, marker * len(req.images))
        return await self._applied(as_chat(req))

    async def _applied(self, chat: ChatRequest) -> str:
        """The chat as the server's own template renders it (`/apply-template`)."""
        return await self.http.call("POST", "/apply-template", self.chat_body(chat), model=chat.model,
                                    parse=lambda obj: wire_text(obj["prompt"]), wait=self.config.first_token_timeout)

    async def _media_marker(self, model: str) -> str:
        """What stands for an image in a prompt: random per server start since /props names it (`media_marker`),
        mtmd's default before. A router's model runs in a server of its own, whose /props it answers with `?model=`
        (its own has no marker)."""
        props = await self.props()
        if _is_router(props):
            props = await self.http.call("GET", f"/props?model={quote(model)}", parse=json_object, model=model,
                                         wait=self.config.first_token_timeout)
        return props.get("media_marker") or "<__media__>"

    async def _with_images(self, req: CompletionRequest, prompt: str) -> dict[str, Any]:
        """/completion's prompt with images (tools/server/README.md): its text with a marker each, and the images
        base64 in their order. Such a prompt holds no token ids: an earlier `context` goes before it as its text, as
        Ollama itself detokenizes it; token ids alone, the images were never sent."""
        before = await self.http.call("POST", "/detokenize", {"tokens": req.context, "model": req.model},
                                      parse=lambda obj: wire_text(obj["content"]),
                                      wait=self.config.first_token_timeout) if req.context else ""
        return {"prompt_string": before + prompt, "multimodal_data": req.images}

    async def _template(self, model: str) -> str:
        """The chat template `model` runs with: the server's; a router's model's own, from its file (the router's
        /props has none, so every model of it was refused `think` here, and had its thinking left in the text)."""
        props = await self.props()
        if not _is_router(props):
            return props.get("chat_template", "")
        # its entry alone (one GET), not a whole listing, which asks /props again and reads every model's file
        path = next((_model_file(e) for e in await self._entries() if e.get("id") == model), "")
        try:
            return (await self.gguf_facts(path)).jinja if os.path.isfile(path) else ""
        except Exception:  # noqa: BLE001 - no GGUF there: a model whose template is unknown
            return ""

    async def _native(self, path: str, req: CompletionRequest,
                      prompt: list[int] | dict[str, Any] | None = None) -> AsyncIterator[Chunk]:
        """A stream from the server, whatever the client asked, unless `always_stream = false` (see
        adapters/http.py). `prompt`: the prompt as token ids (or with images, `_with_images`); each chunk's
        `context` then holds the tokens it adds."""
        asked = asked_of(req, self.config)
        asked = replace(asked, options=llama_reads(asked.options, self._window()))
        body, finished = _with_progress(native_body(asked)), False
        if prompt is not None:
            body.update(prompt=prompt, return_tokens=True)
        async with contextlib.aclosing(self.http.generation(path, body, model=req.model, parse=native_chunk,
                                                            last=_finishes, progress=self.reports_progress)) as events:
            async for chunk in events:
                finished = _finishes(chunk)
                if prompt is None:  # llama-server sends the sampled tokens unasked: no context for raw or infill
                    chunk.context = None
                yield chunk
        if not finished:
            raise BackendError(f"backend {self.name!r} ended the {path} stream before it stopped")

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        """llama-server cannot shorten vectors (`dimensions` is done here, as Ollama does it); `embd_normalize: -1`
        gives the raw vector that legacy /api/embeddings answers. Token ids go as they are: it embeds them without
        a BOS or EOS of its own (tokenize_input_subprompt), and refuses ids past its vocabulary with a 400."""
        body: dict[str, Any] = {"model": req.model, "input": req.inputs, "encoding_format": "float"}
        if not req.normalize:
            body["embd_normalize"] = -1
        if (most := embed_shape.num_ctx(req.options)) is not None:
            body["input"] = await self._within(req, most)
        for tries in range(3):  # the whole, then cut to what the server said it takes (a slot's context, a batch)
            try:
                result = await self.embed_body(body, req.model)
                break
            except (BackendError, ContextOverflow) as e:
                if tries == 2:
                    raise
                cut = _embedded_at_most(e, req.truncate)
                body["input"] = [given[:cut] if req.tokenized else await self._cut(given, req.model, cut)
                                 for given in req.inputs]
        result.embeddings = embed_shape.shorten(result.embeddings, req.dimensions)
        return result

    async def _within(self, req: EmbedRequest, most: int) -> list[str] | list[list[int]]:
        """Each input cut to the client's `num_ctx`, its BOS and EOS included, as Ollama's EmbedHandler cuts it; with
        `truncate` false, one longer is Ollama's 400 (llama-server embedded the whole input, up to its own window)."""
        if req.truncate:
            return [given[:most] if req.tokenized else await self._cut(given, req.model, most) for given in req.inputs]
        for given in req.inputs:
            if len(given if req.tokenized else await self.tokenize(given, req.model, special=True)) > most:
                raise BadRequest("the input length exceeds the context length")  # Ollama's words and status
        return req.inputs

    async def _cut(self, text: str, model: str, most: int) -> list[int]:
        """`text`'s ids as the server embeds the text, with the BOS and EOS or SEP it adds (a BERT's CLS and SEP),
        its own tokens cut so that all fit in `most`. Ids are embedded as they are: without these, every input of a
        batch holding one long input (another caller's, in a micro-batch) came out other than alone (cosine 0.87)."""
        whole = await self.tokenize(text, model, special=True)
        if len(whole) <= most:
            return whole
        own = await self.tokenize(text, model)
        added = len(whole) - len(own)
        head = next((k for k in range(added + 1) if whole[k:k + len(own)] == own), None)
        if head is None:  # the specials changed the text's own tokens: cut the whole
            return whole[:most]
        return whole[:head] + own[:max(most - added, 1)] + whole[head + len(own):]

    async def count_tokens(self, req: ChatRequest | CompletionRequest) -> int | None:
        """A chat rendered by the server's own template (`/apply-template`), then tokenized; a prompt sent as it is
        (raw, or a fill-in-the-middle's prefix and suffix), as it is, a raw prompt's "[img-N]" tags as the images
        `_tagged` sends there (as text, three pictures were 5 tokens); a generate as `_rendered` renders it for
        `_with_context` (a client's Go template: counted through the server's chat template, it was another prompt).
        A generate's `context` goes before its rendered prompt as the ids it is: uncounted, a long one passed the fit
        stage as fitting. Each image adds `IMAGE_TOKENS`, as Ollama counts one: the text's count left them out."""
        if isinstance(req, CompletionRequest) and _sent_as_is(req):
            seen = images_in(req) if reads_tags(req) else 0  # /infill takes none
            return seen * IMAGE_TOKENS + len(await self.tokenize(prompt_read(req) + (req.suffix or ""), req.model))
        before = len(req.context or ()) if isinstance(req, CompletionRequest) else 0
        rendered = await (self._rendered(req, "") if isinstance(req, CompletionRequest) else self._applied(req))
        return before + images_in(req) * IMAGE_TOKENS + len(await self.tokenize(rendered, req.model))

    async def tokenize(self, text: str, model: str, special: bool = False) -> list[int]:
        """Prompt token counts for the proxy (context-length checks) without generating anything. `model` picks a
        router's model (a single-model server ignores it); `special` adds the BOS and EOS the model's text gets."""
        return await self.http.call("POST", "/tokenize", {"content": text, "model": model, "add_special": special},
                                    parse=lambda obj: list(obj["tokens"]), wait=self.config.first_token_timeout)
