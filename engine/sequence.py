"""One request's state as the scheduler and block manager see it: token ids, progress, KV blocks.

Plain data, no torch: the model runner reads it, the scheduler and block manager mutate it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the scheduler and block manager import this module without torch
    from engine.requests import RequestState


class SequenceStatus(enum.Enum):
    WAITING = "waiting"    # queued; holds no KV blocks
    RUNNING = "running"    # admitted; holds KV blocks for all its known tokens
    FINISHED = "finished"  # done (stop token, max_tokens, abort); blocks released


@dataclass(eq=False)  # identity equality: two requests with equal tokens are still two requests
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    max_tokens: int
    stop_token_ids: frozenset[int] = frozenset()
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)  # physical block ids, in order
    num_computed: int = 0        # tokens whose K/V are already written in the cache (prefix hits count)
    num_cached_prefix: int = 0   # tokens served from the radix cache at its latest admission (its locked prefix)
    # prompt tokens the radix cache served before its first token: what usage reports. A preempted sequence is
    # admitted again over its own answer as well (80 "cached" of a 46-token prompt, a negative Anthropic input).
    num_cached_prompt: int = 0
    request: RequestState | None = None  # the engine's per-request state; None for bookkeeping-only sequences
    finish_reason: str | None = None  # "stop", "length" or "abort" once finished
    cache_scope: str = ""  # whose prefixes it may reuse and leaves in the radix cache (engine/radix_cache.py)

    def __post_init__(self) -> None:
        assert self.prompt_ids, "a sequence needs at least one prompt token"
        assert self.max_tokens >= 1, "max_tokens must be >= 1"

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_uncomputed(self) -> int:
        """Known tokens still to run through the model (1 for a decoding sequence)."""
        return self.num_tokens - self.num_computed

    @property
    def is_prefilling(self) -> bool:
        return self.num_uncomputed > 1

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append(self, tokens: list[int]) -> str | None:
        """Append tokens up to the first stop token or the length limit; the finish reason if one hit, or if a
        stop string ended the request's text. The one place that decides a sequence is finished."""
        assert tokens, "nothing to append"
        reason, n = None, 0
        for n, token in enumerate(tokens, 1):
            self.output_ids.append(token)
            if token in self.stop_token_ids:
                reason = "stop"
                break
            if len(self.output_ids) >= self.max_tokens:
                reason = "length"
                break
        if self.request is not None and (kept := self.request.push(self.output_ids[-n:], reason)) is not None:
            del self.output_ids[len(self.output_ids) - n + kept:]
            reason = "stop"
        return reason

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end), without copying the whole sequence."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n:end - n]
        return self.prompt_ids[start:] + self.output_ids[:end - n]
