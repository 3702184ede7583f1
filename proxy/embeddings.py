"""The embedding path: resolve -> observe -> limit -> a micro-batch per backend (proxy/batching/embed_batcher.py) ->
a slot of the backend's queue -> the backend. Not a chunk stream, so not the generation stages; it shares the observe,
limit and admit stages' state."""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import replace
from typing import Iterator

from prometheus_client.core import CounterMetricFamily

from adapters.errors import BackendError, NonFiniteEmbedding
from adapters.protocol import EmbedRequest, EmbedResult
from adapters.wording import counted

from .batching import NORMAL, EmbedBatcher
from .dialects import dialect_of
from .job import Caller
from .keep import Tally
from .metrics import RequestMetrics
from .residency import Residency
from .stages.admit import Admit
from .stages.base import Services
from .stages.limit import Limit
from .token_count import CHARS_PER_TOKEN


class Embeddings:
    def __init__(self, services: Services, metrics: RequestMetrics, residency: Residency, limit: Limit,
                 admit: Admit) -> None:
        self.services, self.metrics, self.residency, self.limit, self.admit = services, metrics, residency, limit, admit
        self.batchers: dict[str, EmbedBatcher] = {}
        self.calls: dict[str, Tally] = services.lease.hold("metrics:embed_calls", dict)[0]  # by backend
        services.registry.register(self)

    async def start(self) -> None:
        batching = self.services.config.batching
        for backend in self.services.router.backends.values():
            # a call in one of the backend's slots, as a generation's: embeddings went around `max_concurrency` (100
            # requests that could not be merged were 100 calls at once to a backend of 4 slots)
            controller = self.admit.controllers.get(backend.name)
            slot = functools.partial(controller.slot, NORMAL) if controller else contextlib.nullcontext
            self.batchers[backend.name] = EmbedBatcher(backend.embed, batching.embed_window_ms,
                                                       batching.embed_max_inputs,
                                                       self.calls.setdefault(backend.name, Tally()), slot=slot,
                                                       name=backend.name)

    async def close(self) -> None:
        for batcher in self.batchers.values():
            await batcher.close()

    async def embed(self, req: EmbedRequest, caller: Caller) -> tuple[EmbedResult, dict[str, str]]:
        """The vectors, and the key's state under its limits in the dialect's headers (OpenAI's `x-ratelimit-*`)."""
        target = await self.services.router.resolve(req.model)
        batcher = self.batchers.get(target.backend.name)
        size = sum(map(len, req.inputs))  # characters, or token ids: then the count itself
        prompt = size if req.tokenized else size // CHARS_PER_TOKEN
        with self.metrics.observe(caller.path, target.label, target.backend.name) as seen:
            self.services.inflight.watch(caller.request_id, req.model, target.backend.name, seen)
            with self.limit.held(caller.tenant, dialect_of(caller.path, {}), prompt) as charge:
                req = replace(req, model=target.model)
                with self.residency.use(target, req.keep_alive):
                    result = await (batcher.embed(req, caller.client) if batcher else target.backend.embed(req))
                charge.tokens = result.prompt_tokens or charge.tokens  # the backend's count, where it gives one
                checked = _finite(_whole(result, len(req.inputs), target.backend.name), target.backend.name)
                return checked, charge.headers  # inside: the metrics count its 502

    def collect(self) -> Iterator[CounterMetricFamily]:
        batches = CounterMetricFamily("velo_embed_backend_calls", "Embedding calls sent after batching",
                                      labels=["backend"])
        for name, calls in self.calls.items():
            batches.add_metric([name], calls.n)
        yield batches


def _whole(result: EmbedResult, inputs: int, backend: str) -> EmbedResult:
    """One vector an input. A batch checks its answer before sharing it out, but a request of `embed_max_inputs`
    inputs or more goes to the backend alone: 69 vectors for 70 inputs went out as a 200, the last input's missing."""
    if len(result.embeddings) != inputs:
        raise BackendError(f"backend {backend!r} returned {counted(len(result.embeddings), 'embedding')} for "
                           f"{counted(inputs, 'input')}")
    return result


def _finite(result: EmbedResult, backend: str) -> EmbedResult:
    """A vector that is not all finite numbers is refused (NonFiniteEmbedding): passed on, it was `null`s in the
    client's vector store, or a 500 in base64. Checked per caller after a batch is split, so only the caller whose
    input it was hears of it. A literal NaN or Infinity is invalid JSON, which the adapters refuse already."""
    for i, vector in enumerate(result.embeddings):
        try:
            finite = all(map(math.isfinite, vector))
        except TypeError:  # null, or not a number at all
            finite = False
        if not finite:
            raise NonFiniteEmbedding(f"backend {backend!r} sent embedding {i} with a value that is not a finite "
                                     "number (NaN, infinity or null)")
    return result
