"""A llama-server that Velo runs itself: a `llamacpp` backend with `model = "...gguf"` (and `command`) instead of
a url. The server starts on the first request that needs it (Velo waits for its /health), stops after `ttl_s`
idle, and is swapped with other managed servers when only `max_loaded` may run (adapters/swaps.py). Listing its
model needs no running server; everything else goes to the server as for any llama-server (adapters/llamacpp.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import socket
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from . import keep_alive
from .base import Backend, BackendConfig
from .gguf_header import read_metadata
from .errors import BackendError, BackendUnavailable
from .llamacpp import LlamaCppBackend, flag_value, gguf_name
from .protocol import (ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, ModelInfo, RunningModel,
                       rfc3339)
from .swaps import Swaps

log = logging.getLogger("velo.adapters.llamacpp_managed")
T = TypeVar("T")
_HEALTH_POLL_S = 0.1  # llama-server answers /health 0.5 s after start for a 100 MB model (MODELS.md)
_LAST_WORDS_S = 1.0  # for the output of a server that exited at start: read to its end, or what came by then
_STOP_GRACE_S = 10.0
_PDEATHSIG: dict[str, bool] = {}  # setpriv's path -> whether it takes --pdeathsig


@dataclass
class ManagedStats:
    """For /metrics and the dashboard."""

    waiting: int = 0  # requests waiting for this server to start (or for room to start it)
    starts: int = 0
    swaps: int = 0  # times it was stopped (or drained) to make room for another
    wait_s: float = 0.0  # seconds requests spent waiting for it, all together
    last_error: str = ""


_EMBEDDING_BATCH = 2048  # Ollama's for embedding models (llm/llama_server.go DefaultEmbeddingNumBatch)


def embeds(command: list[str]) -> bool:
    """Whether the server is started to embed (and so does nothing else)."""
    return bool({"--embedding", "--embeddings"} & set(command))


def embedding_batch(command: list[str]) -> list[str]:
    """An embedding server's batch, as Ollama sets it where the command sets none: llama-server embeds no input
    longer than its physical batch, 512 by default, so a 1,580-token retrieval chunk was cut (Dify) or refused
    (n8n, Flowise) where Ollama embeds it whole. Up to the server's context, as Ollama caps it."""
    if not embeds(command) or {"-b", "--batch-size", "-ub", "--ubatch-size"} & set(command):
        return []
    context = flag_value(command, "-c", "--ctx-size") or ""
    batch = min(_EMBEDDING_BATCH, int(context)) if context.isdigit() and int(context) else _EMBEDDING_BATCH
    return ["-b", str(batch), "-ub", str(batch)]


async def dies_with_velo(cmd: list[str]) -> list[str]:
    """`cmd` under util-linux's `setpriv --pdeathsig TERM`: the server is stopped when Velo dies, by SIGKILL or the
    OOM killer too (it outlived Velo holding its model's memory, and the next start loaded the model again beside
    it). As it is where there is no setpriv (macOS) or one without `--pdeathsig` (util-linux before 2.33), or no
    such program (the start's error names it)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or shutil.which(cmd[0]) is None:
        return cmd
    if setpriv not in _PDEATHSIG:  # asked once: an older setpriv refuses the option, and the server never started
        probe = await asyncio.create_subprocess_exec(setpriv, "--pdeathsig", "TERM", "--", "true",
                                                     stdout=asyncio.subprocess.DEVNULL,
                                                     stderr=asyncio.subprocess.DEVNULL)
        _PDEATHSIG[setpriv] = await probe.wait() == 0
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd] if _PDEATHSIG[setpriv] else cmd


class ManagedLlamaCpp(LlamaCppBackend):
    knows_capabilities = False  # stopped, it lists what the file tells (asking would start it): suffix goes through
    window_once_started = True

    def __init__(self, config: BackendConfig, swaps: Swaps):
        super().__init__(config)
        assert config.model, "a managed llama-server needs a model file"
        self.swaps = swaps
        swaps.add(self)
        self.state = "stopped"  # "starting" | "ready" | "stopping"
        self.users = 0
        self.draining = False
        self.last_used = 0.0
        self.stats = ManagedStats()
        self.process: asyncio.subprocess.Process | None = None
        self._up: asyncio.Future[None] | None = None
        self.launching: asyncio.Task | None = None  # the start under way (adapters/swaps.py)
        self._timer: asyncio.Task | None = None
        self._stopping: asyncio.Task | None = None
        self._output: deque[str] = deque(maxlen=20)
        self._following: asyncio.Task | None = None  # reads _output (held: the loop keeps only weak references)
        self.served_context: int | None = None  # the window its server gave a request when it last ran
        # how long it stays up idle: the last request's keep_alive (Ollama's: 0 stops it at once), else ttl_s
        self.keep_s = self._ttl()

    @property
    def max_loaded(self) -> int:
        return self.config.max_loaded

    @property
    def model_name(self) -> str:
        return self.config.models[0] if self.config.models else gguf_name(self.config.model or "")

    # -- lifecycle, driven by Swaps -----------------------------------------------------------

    def starting(self) -> None:
        self.state, self._up = "starting", asyncio.get_running_loop().create_future()

    def take(self) -> None:
        self.users += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def ready(self) -> None:
        assert self._up is not None
        await asyncio.shield(self._up)

    async def launch(self) -> None:
        """Runs `command -m MODEL --host 127.0.0.1 --port PORT` and waits for /health (up to first_token_timeout:
        a request waiting for a start waits for its first token)."""
        assert self._up is not None
        try:
            await self._run()
            self.stats.last_error = ""  # a start that failed once (a file moved away) kept /ready false for good
        except BaseException as e:
            self.stats.last_error = str(e)
            if isinstance(e, Exception):  # the request waiting for it says only its own 503 or 504
                log.warning("%s", e)
            self._up.set_exception(e if isinstance(e, Exception) else BackendUnavailable("start cancelled"))
            self._up.exception()  # retrieved: the requests waiting on it raise it themselves
            await self._kill()
            raise
        self._up.set_result(None)

    async def _run(self) -> None:
        started, port = time.monotonic(), _free_port()
        self.http.config.urls = [f"http://127.0.0.1:{port}"]
        self._props, self._can_infill = None, None  # facts of the previous process
        self._output.clear()  # its words too: a second failed start quoted the first's error beside its own
        cmd = [*self.config.command, *embedding_batch(self.config.command), "-m", self.config.model or "",
               "--host", "127.0.0.1", "--port", str(port)]
        try:
            self.process = await asyncio.create_subprocess_exec(
                *await dies_with_velo(cmd), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        except OSError as e:
            raise BackendUnavailable(f"backend {self.name!r}: cannot run {cmd[0]!r}: {e}") from e
        self._following = asyncio.get_running_loop().create_task(self._follow(self.process))
        deadline = started + self.config.first_token_timeout
        while not await self.healthy_now():
            exited = self.process.returncode is not None
            if exited or time.monotonic() > deadline:
                if exited:  # its last words may not have been read yet
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(self._following), _LAST_WORDS_S)
                why = f"exited with {self.process.returncode}" if exited \
                    else f"was not ready within {self.config.first_token_timeout:g}s"
                raise BackendUnavailable(f"backend {self.name!r}: llama-server {why}: {' | '.join(self._output)}")
            await asyncio.sleep(_HEALTH_POLL_S)
        self.stats.starts += 1
        log.info("backend %r: llama-server for %s ready on port %d in %.1fs", self.name, self.model_name, port,
                 time.monotonic() - started)

    async def _follow(self, process: asyncio.subprocess.Process) -> None:
        """Keeps the server's last lines, and marks a ready server that exits by itself (a crash, the OOM killer)
        stopped, so the next request starts it again: its dead port stayed "ready", and every request got a 503
        until ttl_s passed without one."""
        assert process.stdout is not None
        async for line in process.stdout:
            self._output.append(line.decode(errors="replace").rstrip())
        code = await process.wait()
        while self.process is process and self.state == "starting":  # an exit its start's last /health did not see
            await asyncio.sleep(_HEALTH_POLL_S)  # (another program answered on its port): it settles as "ready"
        if self.process is not process or self.state != "ready":  # Velo stopped it, or its start saw the exit
            return
        log.warning("backend %r: llama-server for %s exited with %s; the next request starts it again: %s",
                    self.name, self.model_name, code, " | ".join(self._output))
        self.process = None
        await self.http.close()
        await self.swaps.stopped(self)

    async def healthy_now(self) -> bool:
        return await LlamaCppBackend.health(self)

    def idle(self) -> None:
        """The last user left: stop now if another server waits for the room or the last request's keep_alive was
        0, else after `keep_s` (infinite: never)."""
        if self.draining or (self.keep_s == 0 and self.state == "ready"):
            self.stop_soon()
        elif math.isfinite(self.keep_s) and self.state == "ready":
            self._timer = asyncio.get_running_loop().create_task(self._stop_after(self.keep_s))

    def _ttl(self) -> float:
        return self.config.ttl_s or math.inf  # ttl_s 0: kept until another server needs the room

    def _kept(self, keep: Any) -> None:
        """A request's `keep_alive`, as Ollama reads it, decides how long the server stays up after it."""
        self.keep_s = self._ttl() if keep is None else keep_alive.seconds(keep)

    async def _stop_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if self.users == 0 and self.state == "ready":
            log.info("backend %r: llama-server for %s idle for %gs, stopping", self.name, self.model_name, seconds)
            self.stop_soon()

    def stop_soon(self) -> None:
        self.state = "stopping"
        self._stopping = asyncio.get_running_loop().create_task(self._stop())

    async def _stop(self) -> None:
        await self._kill()
        await self.swaps.stopped(self)

    async def _kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
        await self.http.close()

    async def start(self) -> None:
        """The server starts on the first request for its model; what would stop it is said now, in the log, where
        the first request's 503 was the first word of a missing file or program."""
        where = f"backend {self.name!r}"
        if not self._has_model_file():
            log.warning("%s: model file %s not found; its requests will fail until it is there", where,
                        self.config.model)
        if not self._has_program():
            log.warning("%s: %r is not a program on PATH (command = %s); its requests will fail", where,
                        self.config.command[0], self.config.command)

    def _has_model_file(self) -> bool:
        return os.path.isfile(self.config.model or "")

    def _has_program(self) -> bool:
        return shutil.which(self.config.command[0]) is not None

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.launching is not None:
            self.launching.cancel()
            await asyncio.gather(self.launching, return_exceptions=True)
        if self._stopping is not None:
            await self._stopping
        await self._kill()
        self.state = "stopped"
        self.swaps.remove(self)

    # -- the Backend contract ------------------------------------------------------------------

    async def health(self) -> bool:
        """A stopped server is healthy while it can be started: its last start did not fail, and its model file and
        program are there (/ready and the dashboard said a backend whose file was missing was healthy)."""
        if self.state == "ready":
            return await self.healthy_now()
        return not self.stats.last_error and self._has_model_file() and self._has_program()

    async def concurrency(self) -> int:
        return self.config.max_concurrency or 4  # llama-server's default slots; asking would start it

    async def list_models(self) -> list[ModelInfo]:
        """From the file while the server is down (listing never starts it), else what the server says. The file
        tells the template and whether the model fills in the middle, as a running server's /props and /infill
        would: Continue reads both once per model, before its first request, so a stopped server was a model with
        no template and no FIM for the rest of its session. The window is the one the server gave when it last ran
        (its flags, llama.cpp's version and the model decide it): stopped, /api/show said the file's trained
        window, so llama-index and Aider, which size their prompts by it, saw 512 tokens, then 8,192, then 512."""
        if self.state == "ready":
            with contextlib.suppress(BackendError):
                served = [self._as_served(m) for m in await LlamaCppBackend.list_models(self)]
                self.served_context = served[0].context_length if served else None
                return served
        return [self._as_served(await self.file_listing(self.model_name, self.config.model or "",
                                                        self.served_context))]

    def _as_served(self, info: ModelInfo) -> ModelInfo:
        """A server started with --embeddings embeds and does nothing else, as Ollama lists an embedding model."""
        if embeds(self.config.command):
            return replace(info, capabilities=["embedding"])
        return info

    async def show(self, model: str, verbose: bool = False) -> ModelInfo:
        """Stopped, from the file alone (showing never starts it)."""
        if self.state == "ready":
            with contextlib.suppress(BackendError):
                return await self._with_projector(await LlamaCppBackend.show(self, model, verbose), verbose)
        info = await self.with_file(await Backend.show(self, model), self.config.model or "", "", verbose)
        return await self._with_projector(info, verbose)

    async def _with_projector(self, info: ModelInfo, verbose: bool) -> ModelInfo:
        """Ollama's projector_info: the keys of the projector file that the command names (--mmproj), read as
        Ollama's GetModelInfo reads its projector's (long arrays [] unless `verbose`); clients look there for
        clip.has_vision_encoder."""
        path = flag_value(self.config.command, "-mm", "--mmproj")
        if path is None or not os.path.isfile(path):
            return info
        info.shown = {**info.shown, "projector_info": await asyncio.to_thread(read_metadata, path, whole=verbose)}
        return info

    async def running(self) -> list[RunningModel]:
        """The running server's model as listed (size, digest, details), until `keep_s` after its last request (a
        server in use, from now); kept for good, no expiry: /api/ps said it never unloads whatever ttl_s was."""
        if self.state != "ready":
            return []
        idle_for = time.monotonic() - self.last_used if not self.users and self.last_used else 0.0
        kept = {"expires_at": rfc3339(time.time() + self.keep_s - idle_for)} if math.isfinite(self.keep_s) else {}
        return [RunningModel(name=m.name, size=m.size, digest=m.digest, info=m, **kept)
                for m in await self.list_models()]

    async def load(self, model: str, keep: Any) -> int:
        """Ollama's bare load request: the server started if it is not (a stopped one asked its dead port: a 503);
        the nanoseconds that took."""
        await self.show(model)  # an unknown model is a 404, as Ollama answers it
        start = time.perf_counter_ns()
        async with self.swaps.use(self):
            self._kept(keep)
        return time.perf_counter_ns() - start

    async def unload(self, model: str) -> None:
        """Ollama's `keep_alive: 0` with no prompt: the server stops (the answer said "unload", and it ran on)."""
        await self.swaps.unload(self)

    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        return self._held(lambda: LlamaCppBackend.chat(self, req), req.keep_alive)

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        return self._held(lambda: LlamaCppBackend.complete(self, req), req.keep_alive)

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        return await self._once(lambda: LlamaCppBackend.embed(self, req))

    def native(self, method: str, path: str, body: dict[str, Any] | None) -> AsyncIterator[bytes]:
        return self._held(lambda: LlamaCppBackend.native(self, method, path, body))

    async def count_tokens(self, req: ChatRequest | CompletionRequest) -> int | None:
        return await self._once(lambda: LlamaCppBackend.count_tokens(self, req))

    async def _held(self, call: Callable[[], AsyncIterator[T]], keep: Any = None) -> AsyncIterator[T]:
        """The server stays up, and is never swapped out, until the stream is over; then as long as `keep` says."""
        async with self.swaps.use(self):
            try:
                async with contextlib.aclosing(call()) as stream:  # type: ignore[type-var]
                    async for chunk in stream:
                        yield chunk
            finally:  # a request that failed or left says how long too, as Ollama reads it at each request's end
                self._kept(keep)

    async def _once(self, call: Callable[[], Awaitable]) -> object:
        async with self.swaps.use(self):
            return await call()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
