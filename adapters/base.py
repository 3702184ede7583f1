"""The contract every backend adapter fulfils (Ollama, llama.cpp, OpenAI-compatible, Velo's own engine)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from .errors import Unsupported
from .protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, ModelInfo,
                       RunningModel)


@dataclass
class BackendConfig:
    """One `[[backends]]` entry of config.toml, as adapters see it."""

    name: str
    kind: str  # "ollama" | "llamacpp" | "openai" | "engine"
    urls: list[str] = field(default_factory=list)
    api_key: str | None = None
    connect_timeout: float = 5.0
    first_token_timeout: float = 120.0
    idle_timeout: float = 60.0
    total_timeout: float = 600.0
    max_concurrency: int | None = None  # None: ask the backend (llama-server slots), else a default
    models: list[str] = field(default_factory=list)  # names served when the backend cannot list them
    options: dict[str, Any] = field(default_factory=dict)  # kind-specific keys (engine: model path, ...)


class Backend(ABC):
    """A model server. Streams are async iterators of `Chunk`s; the last one carries `finish_reason`.

    Closing a stream early (the client went away) must cancel the backend's work.
    """

    def __init__(self, config: BackendConfig):
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    async def start(self) -> None:
        """Open connections / load models. Called once before serving."""

    async def close(self) -> None:
        """Release connections and workers."""

    @abstractmethod
    async def list_models(self) -> list[ModelInfo]: ...

    async def show(self, model: str) -> ModelInfo:
        for info in await self.list_models():
            if info.name == model:
                return info
        from .errors import ModelNotFound
        raise ModelNotFound(model)

    async def running(self) -> list[RunningModel]:
        return [RunningModel(name=m.name, size=m.size, digest=m.digest, info=m) for m in await self.list_models()]

    @abstractmethod
    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]: ...

    @abstractmethod
    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]: ...

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        raise Unsupported(f"backend {self.name!r} ({self.config.kind}) does not serve embeddings")

    async def concurrency(self) -> int:
        """How many requests the backend runs at once (config, else what it reports, else 4)."""
        return self.config.max_concurrency or 4

    async def health(self) -> bool:
        return True

    def manage(self, method: str, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Ollama model management (/api/pull, /api/create, ...): a stream of status objects."""
        raise Unsupported(f"{path} needs an Ollama backend; {self.name!r} is {self.config.kind}")
