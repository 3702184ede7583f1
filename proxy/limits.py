"""Per-key limits (the `[limits]` table): requests and tokens per minute as token buckets with a burst, and a cap
on requests running at once, each per API key. Plain bookkeeping with an injectable clock; the pipeline stage
(proxy/stages/limit.py) applies it and words the answer in the client's dialect.

A bucket holds up to `burst` units and refills at `per_minute / 60` a second; a request takes one unit of the
request bucket, and its tokens from the token bucket: the prompt estimate up front (so a burst of big requests
cannot all pass at once), the difference to the real count once the answer is done. The token bucket may go into
debt that way; later requests then wait until it is paid back, as OpenAI's token limit behaves.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from adapters.errors import Overloaded
from adapters.schema import setting
from adapters.wording import counted

_MAX_KEYS = 10_000  # buckets kept before idle, refilled ones are dropped (they equal fresh ones)


@dataclass
class LimitsConfig:
    """Per API key (each key its own buckets; requests without a key share one). 0 turns a limit off."""

    requests_per_minute: int = setting(0, "requests a key may start per minute, on average", min=0)
    request_burst: int | None = setting(None, "requests a key may start at once after being idle", min=1,
                                        default_doc="requests_per_minute")
    tokens_per_minute: int = setting(0, "prompt + output tokens a key may use per minute, on average (answers "
                                     "from the cache cost none)", min=0)
    token_burst: int | None = setting(None, "tokens a key may use at once after being idle", min=1,
                                      default_doc="tokens_per_minute")
    concurrency: int = setting(0, "requests of one key running at once; more get 429 at once", min=0)


class RateLimited(Overloaded):
    """Over a key's limit: 429 with Retry-After, and the dialect's rate-limit headers."""

    code = "rate_limit_exceeded"

    def __init__(self, message: str, limit: str, retry_after: float):
        super().__init__(message, retry_after=retry_after)
        self.limit = limit  # "requests" | "tokens" | "concurrency"
        self.headers: dict[str, str] = {}  # the dialect's, set by the stage


@dataclass
class Bucket:
    capacity: float
    per_second: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + max(0.0, now - self.updated) * self.per_second)
        self.updated = max(now, self.updated)

    def wait_for(self, units: float) -> float:
        """Seconds until `units` are there (0: now)."""
        return max(0.0, (units - self.level) / self.per_second)

    def until_full(self) -> float:
        return max(0.0, (self.capacity - self.level) / self.per_second)


@dataclass
class State:
    """One key's view for the response headers: limit, remaining and seconds until full, per bucket."""

    requests: tuple[int, int, float] | None = None
    tokens: tuple[int, int, float] | None = None


@dataclass(eq=False)
class Share:
    """A request's share of its key's limits, taken for a request admitted later (`KeyLimits.reserve`): one of the
    key's requests, its prompt's tokens, one of its requests running."""

    limits: KeyLimits
    key: str
    tokens: int  # the prompt's estimate, trued up to what the answer used once it ends
    held: bool = True  # until the request is admitted with it (`take`), or gives it back


@dataclass
class _Key:
    requests: Bucket | None
    tokens: Bucket | None
    running: int = 0


@dataclass
class KeyLimits:
    cfg: LimitsConfig
    clock: Callable[[], float] = time.monotonic
    keys: dict[str, _Key] = field(default_factory=dict)
    refused: dict[tuple[str, str], int] = field(default_factory=dict)  # (label, limit) -> 429s
    sweep_at: int = _MAX_KEYS  # the number of keys at which idle ones are dropped next

    @property
    def active(self) -> bool:
        return bool(self.cfg.requests_per_minute or self.cfg.tokens_per_minute or self.cfg.concurrency)

    def admit(self, key: str, prompt_tokens: int, label: str | None = None) -> State:
        """Takes a request's share for `key` or raises RateLimited (taking nothing); a refusal is counted under
        `label` (what /metrics may show; `key` by default)."""
        entry = self._check(key, prompt_tokens, label)
        if entry.tokens is not None:
            entry.tokens.level -= prompt_tokens
        if entry.requests is not None:
            entry.requests.level -= 1
        entry.running += 1
        return self.state(key)

    def reserve(self, key: str, prompt_tokens: int, label: str | None = None) -> Share:
        """A request's share taken now (as `admit`), for a request admitted later, in a task of its own (a
        background response), or RateLimited while its client still waits. Checked only, each of a burst found the
        key's buckets as they were before any of their tasks had taken from them: four answered `queued` under a
        limit of one request a minute, and three then failed over it, which no SDK retries."""
        self.admit(key, prompt_tokens, label)
        return Share(self, key, prompt_tokens)

    def take(self, share: Share) -> bool:
        """True where `share` is this one's and still held: its request is admitted with it, charged nothing more."""
        if share.limits is not self or not share.held:
            return False
        share.held = False
        return True

    def give_back(self, share: Share) -> None:
        """The share is no longer held: its request ended before it was admitted with it, and no backend spent a
        token on it. The request stays counted, as one refused after its admission."""
        if share.held:
            share.held = False
            self.done(share.key, -share.tokens)

    def _check(self, key: str, prompt_tokens: int, label: str | None = None) -> _Key:
        """RateLimited where `admit` would refuse the request now, taking nothing. Only with the taking: a check
        alone, for a request admitted later, let each of a burst through (`reserve`)."""
        entry, now, label = self._entry(key), self.clock(), label or key
        for bucket in (entry.requests, entry.tokens):
            if bucket is not None:
                bucket.refill(now)
        if self.cfg.concurrency and entry.running >= self.cfg.concurrency:
            self._refuse(label, "concurrency", f"this key has {counted(entry.running, 'request')} running "
                         f"(limit {self.cfg.concurrency})", 1.0)
        if entry.requests is not None and entry.requests.level < 1:
            self._refuse(label, "requests", f"request limit of {self.cfg.requests_per_minute} per minute reached",
                         entry.requests.wait_for(1))
        if entry.tokens is not None:
            wanted = min(prompt_tokens, entry.tokens.capacity)
            if entry.tokens.level < wanted or entry.tokens.level <= 0:
                self._refuse(label, "tokens", f"token limit of {self.cfg.tokens_per_minute} per minute reached",
                             entry.tokens.wait_for(max(wanted, 1)))
        return entry

    def done(self, key: str, tokens_more: int) -> None:
        """The request ended; `tokens_more` is what it used beyond its prompt estimate (negative: less)."""
        self.keys[key].running -= 1
        self.spent(key, tokens_more)

    def spent(self, key: str, tokens: int) -> None:
        """`tokens` more of the key's (a part of a request that was admitted whole, as one)."""
        entry = self.keys[key]
        if entry.tokens is not None:
            entry.tokens.refill(self.clock())
            entry.tokens.level -= tokens

    def state(self, key: str) -> State:
        entry = self.keys[key]
        return State(*(None if b is None else (int(b.capacity), max(0, math.floor(b.level)), b.until_full())
                       for b in (entry.requests, entry.tokens)))

    def reconfigure(self, cfg: LimitsConfig) -> None:
        """New limits, as if they had been in force all along: what each key used stays used (a bucket keeps what it
        lacks of full, so a lower limit can leave a key in debt), its requests running stay counted, and a limit
        turned on starts full. A reload that built fresh buckets gave every key, a throttled one too, a full
        allowance and forgot its running requests."""
        now = self.clock()
        for entry in self.keys.values():
            entry.requests = _resized(entry.requests, cfg.requests_per_minute, cfg.request_burst, now)
            entry.tokens = _resized(entry.tokens, cfg.tokens_per_minute, cfg.token_burst, now)
        self.cfg = cfg

    def running(self) -> dict[str, int]:
        return {key: e.running for key, e in self.keys.items() if e.running}

    def _refuse(self, key: str, limit: str, why: str, retry_after: float) -> None:
        self.refused[key, limit] = self.refused.get((key, limit), 0) + 1
        raise RateLimited(f"rate limit exceeded: {why}; retry in {math.ceil(retry_after)} s", limit, retry_after)

    def _entry(self, key: str) -> _Key:
        entry = self.keys.get(key)
        if entry is None:
            if len(self.keys) >= self.sweep_at:
                self._drop_idle()
                # A sweep costs a pass over every key: when it frees little (made-up keys, each with one request
                # taken), the next one waits until there are twice as many, so each new key costs O(1) on average.
                self.sweep_at = max(_MAX_KEYS, 2 * len(self.keys))
            now, cfg = self.clock(), self.cfg
            entry = self.keys[key] = _Key(_bucket(cfg.requests_per_minute, cfg.request_burst, now),
                                          _bucket(cfg.tokens_per_minute, cfg.token_burst, now))
        return entry

    def _drop_idle(self) -> None:
        now = self.clock()
        for key, entry in list(self.keys.items()):
            buckets = [b for b in (entry.requests, entry.tokens) if b is not None]
            for b in buckets:
                b.refill(now)
            if not entry.running and all(b.level >= b.capacity for b in buckets):
                del self.keys[key]


def _bucket(per_minute: int, burst: int | None, now: float) -> Bucket | None:
    if not per_minute:
        return None
    capacity = float(burst or per_minute)
    return Bucket(capacity, per_minute / 60, capacity, now)


def _resized(old: Bucket | None, per_minute: int, burst: int | None, now: float) -> Bucket | None:
    new = _bucket(per_minute, burst, now)
    if new is not None and old is not None:
        old.refill(now)
        new.level -= old.capacity - old.level
    return new
