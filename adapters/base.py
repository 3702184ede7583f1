"""The contract every backend adapter fulfils (Ollama, llama.cpp, OpenAI-compatible, Velo's own engine)."""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable

from .errors import Unsupported
from .schema import setting
from .protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, ModelInfo,
                       RunningModel)

if TYPE_CHECKING:
    from aiohttp import StreamReader


# An image's tokens where a count cannot see it: llama-server's /tokenize reads a chat's rendered text, where an image
# is a marker of a few tokens, and no endpoint says what its projector makes of one (Gemma 3 256, LLaVA-1.5 576,
# Qwen2.5-VL by size); an estimate reads characters. 768 is Ollama's own figure for fitting a chat with images to
# num_ctx (server/prompt.go imageNumTokens). The fit stage's cheap bound takes Qwen2-VL's most, 16,384, which as a
# count would make every image overflow a window under that (a 256-token Gemma 3 picture a 400 on an 8k server).
IMAGE_TOKENS = 768


@dataclass
class BackendConfig:
    """One model server (a `[[backends]]` table)."""

    name: str = setting(doc="how routes and aliases refer to it")
    kind: str = setting(doc='"ollama" | "llamacpp" | "openai" (vLLM, SGLang, LM Studio, ...) | "engine" '
                            "(Velo's in-process engine)")
    urls: list[str] = setting(factory=list, doc="the server's base URL (no /v1 suffix for ollama and llamacpp; "
                              "with or without it for openai), as `url = \"...\"`; `urls = [...]` lists replicas of "
                              "one backend. Required except for kind \"engine\"")
    api_key: str | None = setting(None, "sent as a Bearer token", default_doc="none", secret=True)
    # Timeouts are above 0: a 0 made every request a 504 where 0 turns other keys off (default_max_tokens, ttl_s).
    connect_timeout: float = setting(5.0, "seconds to open a connection; then a clear 504", min=0.001)
    # 300 s: Ollama's own limit on a model load that stalls; a CPU reads a long prompt for minutes (Qwen2.5-Coder-1.5B
    # on 2 cores: 12,307 tokens in 310 s), which llama-server reports as progress, each report a new wait.
    first_token_timeout: float = setting(300.0, "seconds until the first token, each gap of it for a backend that "
                                         "reports its progress through the prompt (llama-server); an embedding from "
                                         "a server, whose answer comes whole, gets this for each input, within "
                                         "total_timeout; then a clear 504", min=0.001)
    idle_timeout: float = setting(60.0, "seconds between streamed bytes; then a clear 504", min=0.001)
    # 1800 s: the default output cap (4096 tokens) at a CPU's few tokens a second, after a long prompt.
    total_timeout: float = setting(1800.0, "seconds for a whole answer; then a clear 504", min=0.001)
    always_stream: bool = setting(True, "ask for a stream also when the client asked for one answer, so a hung "
                                  "backend is found after first_token_timeout; false sends such requests as asked: "
                                  "less work for a busy vLLM or SGLang, but a hang is found only after "
                                  "total_timeout")
    max_concurrency: int | None = setting(None, "requests sent at once; the rest wait in Velo's queue",
                                          min=1, default_doc="what the backend reports (llama-server's slots), else 4")
    models: list[str] = setting(factory=list, doc="openai and llamacpp: the names listed in place of the server's "
                                "own listing (a managed llama-server serves its model under the first); ollama and "
                                "engine backends list their own and ignore it")
    options: dict[str, Any] = setting(factory=dict, doc="kind-specific settings (engine: model, device, ...; "
                                      "replica sets: affinity, ...), see below")
    model: str | None = setting(None, 'llamacpp without a url: a GGUF file that Velo serves with its own '
                                "llama-server, started on the first request for it", default_doc="none (use url)")
    command: list[str] = setting(factory=lambda: ["llama-server"], doc="with `model`: the server and its arguments; "
                                 "Velo adds -m MODEL --host 127.0.0.1 --port PORT",
                                 default_doc='["llama-server"] (on PATH)')
    ttl_s: float = setting(300.0, "with `model`: seconds idle before the server is stopped (0: kept until another "
                           "model needs the room)", min=0)
    max_loaded: int = setting(1, "with `model`: managed servers, this one included, that may run while it runs (1: "
                              "alone); a request for a model that does not fit waits until the running servers' "
                              "streams end, and the least recently used stops", min=1)


class Backend(ABC):
    """A model server. Streams are async iterators of `Chunk`s; the last one carries `finish_reason`.

    Closing a stream early (the client went away) must cancel the backend's work.
    """

    fits_context = False  # True where the server itself keeps a chat inside its context (Ollama drops old turns)
    # True where the server refuses a prompt whose max_tokens reaches past the window (vLLM, SGLang) instead of
    # stopping at its end (llama-server, Ollama, the engine)
    refuses_output_past_window = False
    forces_tool_choice = False  # True where a required or named tool_choice always gets a call (engine, vLLM)
    constrains_format = False  # True where `format` is decoded under a grammar, so the answer can stream unchecked
    default_keep_alive: Any = None  # how long a model stays after a request without keep_alive (None: 5 minutes)
    idle_unload = False  # True where Velo loads the model itself and unloads it when keep_alive runs out (engine)
    # True where the model's window is known only once its server runs (a managed llama-server before its first
    # start: its flags and llama.cpp's version decide it)
    window_once_started = False
    knows_capabilities = True  # its models' capabilities are facts (False: assumed, as the OpenAI API cannot say)
    # True where a name the server does not list would still be answered, by another model (a single-model
    # llama-server ignores `model`): such names are Ollama's 404, not a silent stand-in
    answers_unlisted_names = False
    # True where `show` finds every model a request may name, so that its 404 is the request's own (Ollama looks a
    # name up for /api/show as for /api/chat; the engine has its one model): a count then answers it as generation
    # does. False where a server may answer names it does not list (OpenAI-compatible ones, a single-model llama-server)
    shows_every_model = False
    own_defaults: str | None = None  # the dialect whose defaults the server itself fills in (Ollama: "ollama")

    def __init__(self, config: BackendConfig):
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    async def start(self) -> None:
        """Open connections / load models. Called once before serving."""

    async def close(self) -> None:
        """Release connections and workers."""

    @property
    def loading(self) -> bool:
        """Whether a model load runs in a thread of this process now: nothing stops one, and the exit waits for it."""
        return False

    @abstractmethod
    async def list_models(self) -> list[ModelInfo]: ...

    async def show(self, model: str, verbose: bool = False) -> ModelInfo:
        """`verbose` (Ollama's ShowRequest's) is for a backend that has more to say with it: an Ollama backend's
        long model_info arrays; a listing has none."""
        for info in await self.list_models():
            if info.name == model:
                return info
        from .errors import ModelNotFound
        raise ModelNotFound(model)

    async def load(self, model: str, keep: Any) -> int:
        """Ollama's bare load request (no prompt): load `model` if it is not; the nanoseconds that took."""
        await self.show(model)  # an unknown model is a 404, as Ollama answers it
        return 0

    async def unload(self, model: str) -> None:
        """Ollama's `keep_alive: 0`: free the model's memory; it loads again on the next request. A server Velo
        cannot tell to unload keeps it."""

    async def running(self) -> list[RunningModel]:
        return [RunningModel(name=m.name, size=m.size, digest=m.digest, info=m) for m in await self.list_models()]

    @abstractmethod
    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]: ...

    @abstractmethod
    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]: ...

    async def count_tokens(self, req: ChatRequest | CompletionRequest) -> int | None:
        """The prompt tokens of `req` as this backend renders and tokenizes it, or None when it cannot say."""
        return None

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        raise Unsupported(f"backend {self.name!r} ({self.config.kind}) does not serve embeddings")

    async def concurrency(self) -> int:
        """How many requests the backend runs at once (config, else what it reports, else 4)."""
        return self.config.max_concurrency or 4

    def watch_slots(self, resize: Callable[[int], None]) -> None:
        """Has `resize(n)` called when the requests the backend takes at once change while it runs (a replica set's
        replicas going out of service and back), so that what it cannot take waits in the admit stage's queue. Most
        backends' never change."""

    async def health(self) -> bool:
        return True

    def figures(self) -> dict[str, float]:
        """The backend's own figures for /metrics, by name (Velo's engine: its batch, KV cache and tokens); none
        where Velo sees only the wire."""
        return {}

    def manage(self, method: str, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Ollama model management (/api/pull, /api/create, ...): a stream of status objects."""
        raise Unsupported(f"{path} needs an Ollama backend; {self.name!r} is {self.config.kind}")

    async def blob(self, method: str, digest: str, body: StreamReader | None) -> int:
        """A model file's check or upload at Ollama's /api/blobs (OllamaBackend.blob): its status."""
        raise Unsupported(f"/api/blobs needs an Ollama backend; {self.name!r} is {self.config.kind}")

    def native(self, method: str, path: str, body: dict[str, Any] | None) -> AsyncIterator[bytes]:
        """llama-server's own routes (proxy/routes_llama.py), its answer's bytes as they come."""
        raise Unsupported(f"{path} needs a llama-server backend; {self.name!r} is {self.config.kind}")


async def start_all(backends: Iterable[Backend]) -> None:
    """Every backend's start at once; at the first failure (or a cancel) the others are cancelled, and over, before
    it is raised: one left running past its owner's close (a generation's backend, a set's replica; a replica set
    still probing) went on to open what nothing would close (its health prober, probing for good)."""
    tasks = [asyncio.ensure_future(backend.start()) for backend in backends]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
