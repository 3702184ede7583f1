"""Per-key limits (proxy/limits.py): requests and tokens per minute, and requests at once, per API key.

Placed after observe, so a refused request is counted on /metrics with its 429, and before fit and the cache: a
limit is the caller's quota, and every request costs Velo work, cache hits included, so a repeated question is no
way around the request limit. Tokens are what backends spend, so an answer from the cache costs none.

Every answer carries the key's state in the client's own headers: OpenAI's `x-ratelimit-*` (the Chat Completions
and Responses APIs), Anthropic's `anthropic-ratelimit-*` (the Messages API); Ollama's API has none, so its clients
get only the 429 with Retry-After.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from adapters.errors import BackendUnavailable, Overloaded
from adapters.protocol import Chunk

from ..auth import key_labels
from ..job import Job
from ..limits import KeyLimits, RateLimited, Share, State
from ..token_count import estimate
from .base import Next, Services, Stage


@dataclass
class Charge:
    """The tokens a request held under the limits is charged: its prompt's estimate, or what it used once known;
    and the key's state in the dialect's headers, for its answer."""

    tokens: int
    headers: dict[str, str] = field(default_factory=dict)


# Refusals to be retried later (Velo's queue full or its wait over, a busy backend, one down or unreachable): before
# the answer began, no backend spent a token on them, and a client retrying as told ran out of its tokens per minute
_REFUSED = (Overloaded, BackendUnavailable)


class Limit(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        cfg = services.config.limits
        self.limits, self.fresh = services.lease.hold("limits", lambda: KeyLimits(cfg))
        self.named = key_labels(tuple(services.config.server.keys))
        services.registry.register(self)

    async def start(self) -> None:
        """Keys' buckets and running requests are kept through a reload (their requests in flight end on them);
        changed limits apply to them from now."""
        cfg = self.services.config.limits
        if not self.fresh and cfg != self.limits.cfg:
            self.limits.reconfigure(cfg)

    def wraps(self, job: Job) -> bool:
        """Whether any limit is set."""
        return self.limits.active

    async def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        """A request of several parts (Job.parts) is admitted once, for all its prompts, and held until its last
        part ends; every part's tokens are counted."""
        key, prompt, parts = job.caller.tenant, estimate(job.request), job.parts
        try:
            admitted = await self._admitted(job, key, prompt)
        except BaseException:  # refused, or the part left while its request was admitted: it ends here
            if parts is not None and parts.leave():
                self.limits.done(key, 0)
            raise
        counted, pieces, began, refused = 0, 0, False, False
        try:
            async with contextlib.aclosing(next(job)) as rest:
                async for chunk in rest:
                    began = True
                    counted, pieces = _tokens(chunk, prompt) or counted, pieces + bool(chunk.text)
                    yield chunk
        except _REFUSED:
            refused = not began
            raise
        finally:
            billed = job.outcome.billed
            free = refused or (job.outcome.coalesced and billed is None) or job.outcome.cache in ("exact", "semantic")
            spent = 0 if free else counted or prompt + pieces
            if billed is not None:  # a shared call that its first request left (Coalescer.stream): its part of it
                paid, upto = billed
                spent = spent if upto is None else _charged(upto, prompt)
                spent -= 0 if paid is None else _charged(paid, prompt)
            if len(job.outcome.calls) > 1:  # repair asked again: the backend spent every call's tokens
                spent = sum(job.outcome.calls)
            if parts is None or parts.leave():
                self.limits.done(key, spent - admitted)
            else:
                self.limits.spent(key, spent - admitted)

    async def _admitted(self, job: Job, key: str, prompt: int) -> int:
        """The tokens charged for this job at admission: its prompt's, or its request's for the part that admits
        it, 0 for a part that waited for that; those of the share it took at the edge, with its headers then."""
        if job.share is not None and self.limits.take(job.share):
            return job.share.tokens
        parts = job.parts
        if parts is None:
            job.outcome.rate_limit = self._admit(key, job.dialect, prompt)
            return prompt
        if not parts.first():
            job.outcome.rate_limit = await asyncio.shield(parts.admission)  # type: ignore[arg-type]
            return 0
        try:
            job.outcome.rate_limit = self._admit(key, job.dialect, parts.prompt)
        except RateLimited as e:
            parts.admission.set_exception(e)  # type: ignore[union-attr]
            parts.admission.exception()  # type: ignore[union-attr] - each waiting part raises it itself
            raise
        parts.admission.set_result(job.outcome.rate_limit)  # type: ignore[union-attr]
        return parts.prompt

    @contextlib.contextmanager
    def held(self, tenant: str, dialect: str, prompt: int) -> Iterator[Charge]:
        """A request that is no answer stream (embeddings, llama-server's own routes: /completion, /infill, /rerank)
        under the same limits, which it went around: a 429 over them, one of the key's requests at once while it
        runs, `prompt` (an estimate) its tokens until the caller sets what it used."""
        charge = Charge(prompt)
        if not self.limits.active:
            yield charge
            return
        charge.headers = self._admit(tenant, dialect, prompt)
        try:
            yield charge
        except _REFUSED:
            charge.tokens = 0
            raise
        finally:
            self.limits.done(tenant, charge.tokens - prompt)

    def reserve(self, job: Job) -> Share | None:
        """The job's share of its key's limits taken now (KeyLimits.reserve), the key's state in the dialect's
        headers; or RateLimited, with them. A background response is admitted in its own task, after its request
        has answered `queued`, where OpenAI answers the request itself with a 429 and Retry-After, which the SDKs
        wait out."""
        if not self.limits.active:
            return None
        key = job.caller.tenant
        with self._stated(key, job.dialect):
            share = self.limits.reserve(key, estimate(job.request), self.label(key))
        job.outcome.rate_limit = headers(job.dialect, self.limits.state(key))
        return share

    def _admit(self, key: str, dialect: str, prompt: int) -> dict[str, str]:
        """The key's share taken, and its state in the dialect's headers; or RateLimited, with them."""
        with self._stated(key, dialect):
            return headers(dialect, self.limits.admit(key, prompt, self.label(key)))

    @contextlib.contextmanager
    def _stated(self, key: str, dialect: str) -> Iterator[None]:
        """A refusal inside carries the key's state in the dialect's headers."""
        try:
            yield
        except RateLimited as e:
            e.headers = headers(dialect, self.limits.state(key))
            raise

    def label(self, tenant: str) -> str:
        """What /metrics calls a key: a configured key's label, the anonymous scope, else `other` (with no
        `api_keys` any client may send made-up keys, each its own scope: as labels they would grow /metrics
        without bound)."""
        return self.named.get(tenant, "other")

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        refused = CounterMetricFamily("velo_rate_limited", "Requests refused by a per-key limit",
                                      labels=["key", "limit"])
        for (label, limit), n in self.limits.refused.items():
            refused.add_metric([label, limit], n)
        running = GaugeMetricFamily("velo_key_in_flight", "Requests running per API key (key1, key2, ...: "
                                    "its place in the config; keys not configured: other)", labels=["key"])
        by_label: dict[str, int] = {}
        for key, n in self.limits.running().items():
            by_label[self.label(key)] = by_label.get(self.label(key), 0) + n
        for label, n in by_label.items():
            running.add_metric([label], n)
        yield refused
        yield running


def _charged(chunks: list[Chunk], prompt: int) -> int:
    """What a request that got `chunks` was charged, counted as the stage counts them as they pass."""
    counted, pieces = 0, 0
    for chunk in chunks:
        counted, pieces = _tokens(chunk, prompt) or counted, pieces + bool(chunk.text)
    return counted or prompt + pieces


def _tokens(chunk: Chunk, prompt: int) -> int:
    """The backend's own count, once it gives one (the last chunk): prompt and output."""
    usage = chunk.usage
    if usage is None or not (usage.prompt_tokens or usage.completion_tokens):
        return 0
    return (usage.prompt_tokens or prompt) + usage.completion_tokens


def headers(dialect: str, state: State) -> dict[str, str]:
    """The key's state as the dialect's API reports its own limits."""
    out: dict[str, str] = {}
    for what, counted in (("requests", state.requests), ("tokens", state.tokens)):
        if counted is None:
            continue
        limit, remaining, reset_s = counted
        if dialect in ("openai", "responses"):
            out |= {f"x-ratelimit-limit-{what}": str(limit), f"x-ratelimit-remaining-{what}": str(remaining),
                    f"x-ratelimit-reset-{what}": _duration(reset_s)}
        elif dialect == "anthropic":
            at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=reset_s)
            out |= {f"anthropic-ratelimit-{what}-limit": str(limit),
                    f"anthropic-ratelimit-{what}-remaining": str(remaining),
                    f"anthropic-ratelimit-{what}-reset": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return out


def _duration(seconds: float) -> str:
    """OpenAI's way: "12ms", "1s", "6m0s"."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"
