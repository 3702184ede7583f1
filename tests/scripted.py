"""An in-process Backend that answers from a script, for testing the proxy's dialects without HTTP.

It records every internal request it receives, so tests can assert what the dialect parsers produced.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from adapters.base import Backend, BackendConfig
from adapters.errors import BackendError
from adapters.protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, ModelInfo,
                               TokenLogprob, ToolCall, Usage)

MODIFIED_AT = "2024-05-01T10:00:00.123456789-07:00"  # as Ollama writes it: nanoseconds and an offset
# A model's [models] options setting every knob some dialect's defaults set (proxy/stages/resolve.py), so a request
# in any dialect asks the very same: for tests of what the dialects share (cache entries, coalesced calls).
SAME_IN_EVERY_DIALECT = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
                         "repeat_last_n": 64}

@dataclass
class Script:
    pieces: list[str] = field(default_factory=lambda: ["Hel", "lo", " world"])
    thinking: str = ""  # streamed first, as one chunk
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    fail_after: int | None = None  # raise BackendError after this many chunks
    delay: float = 0.0
    silence: float = 0.0  # before anything, as Ollama sends nothing while it reads a long prompt
    last_in_finish: bool = False  # the last piece comes in the finishing chunk, as the engine and llama-server send it
    eval_ns: int = 0  # the decoding time the finishing chunk reports
    empties: int = 0  # empty chunks before each piece, as a backend holding text back for a stop string sends
    cached_tokens: int = 0  # of the 5 prompt tokens, those the backend's prefix cache served
    after_finish: float = 0.0  # the stream stays open this long past its finishing chunk (a stage's work after it)
    fail_after_finish: bool = False  # then raises BackendError


class ScriptedBackend(Backend):
    def __init__(self, name: str = "scripted", models: tuple[str, ...] = ("tiny:latest",), script: Script | None = None,
                 capabilities: tuple[str, ...] = ("completion", "tools", "thinking", "insert", "vision"),
                 context_length: int | None = 8192, trained_context: int | None = None):
        super().__init__(BackendConfig(name=name, kind="openai", urls=["http://scripted"]))
        self.models = list(models)
        self.capabilities, self.context_length = list(capabilities), context_length
        self.trained_context = trained_context  # what the model's file says, where it is larger than what it runs
        self.script = script or Script()
        self.requests: list[Any] = []
        self.digest = ""  # the models' as listed: a model pulled again under its name
        self.cancelled = 0
        self.completed = 0

    async def list_models(self) -> list[ModelInfo]:
        trained = {"llama.context_length": self.trained_context} if self.trained_context else {}
        return [ModelInfo(name=m, family="llama", context_length=self.context_length, model_info=trained,
                          capabilities=list(self.capabilities), modified_at=MODIFIED_AT, digest=self.digest)
                for m in self.models]

    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        self.requests.append(req)
        return self._run(True) if req.options.logprobs else self._run()

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        self.requests.append(req)
        return self._run(True) if req.options.logprobs else self._run()

    async def count_tokens(self, req: ChatRequest | CompletionRequest) -> int:
        """An exact count of the double's own: one token per word, plus one per message (a completion: and one per
        id of its `context`, as the backends count it)."""
        if isinstance(req, CompletionRequest):
            return len(req.context or ()) + len(req.prompt.split())
        return sum(len(m.content.split()) + 1 for m in req.messages)

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        self.requests.append(req)
        return EmbedResult(embeddings=[[float(len(t)), 1.0, 0.0] for t in req.inputs], prompt_tokens=len(req.inputs))

    async def _run(self, logprobs: bool = False) -> AsyncIterator[Chunk]:
        """With `logprobs`, each piece is one token of logprob -0.5, with " x" as the runner-up."""
        s = self.script
        try:
            if s.silence:
                await asyncio.sleep(s.silence)
            if s.thinking:
                yield Chunk(thinking=s.thinking)
            pieces = s.pieces[:-1] if s.last_in_finish else s.pieces
            for i, piece in enumerate(pieces):
                if s.fail_after is not None and i >= s.fail_after:
                    raise BackendError("scripted backend broke mid-stream")
                if s.delay:
                    await asyncio.sleep(s.delay)
                for _ in range(s.empties):
                    yield Chunk()
                yield Chunk(text=piece, logprobs=_logprobs(piece) if logprobs else [])
            yield Chunk(text=s.pieces[-1] if s.last_in_finish and s.pieces else "", tool_calls=list(s.tool_calls),
                        finish_reason=s.finish_reason,  # type: ignore[arg-type]
                        usage=Usage(prompt_tokens=5, completion_tokens=len(s.pieces), cached_tokens=s.cached_tokens,
                                    eval_ns=s.eval_ns))
            if s.after_finish:
                await asyncio.sleep(s.after_finish)
            if s.fail_after_finish:
                raise BackendError("scripted backend broke after its answer")
            self.completed += 1
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled += 1
            raise


def _logprobs(piece: str) -> list[TokenLogprob]:
    return [TokenLogprob(piece, -0.5, [TokenLogprob(piece, -0.5), TokenLogprob(" x", -2.0)])]
