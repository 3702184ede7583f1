"""One request's trip through the pipeline: what the client asked (fixed at the edge) and what happened to it
(written only by the pipeline's stages, read by the route once the answer starts and when it ends)."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator

from adapters.protocol import ChatRequest, Chunk, CompletionRequest

from .batching.admission import Place
from .context_edits import Applied, Edit
from .limits import Share
from .router import Target

Request = ChatRequest | CompletionRequest


@dataclass(frozen=True)
class Caller:
    """Who is asking, from the authentication middleware (proxy/auth.py)."""

    tenant: str = "anonymous"  # cache scope: no request ever sees another tenant's cached answer
    client: str = ""  # for fairness and autocomplete supersession
    path: str = ""  # the URL path asked, e.g. "/api/chat"
    request_id: str = ""  # X-Velo-Request-Id: the request's entry in proxy/inflight.py


@dataclass
class Outcome:
    """What the stages did; the route turns it into response headers and the access log."""

    cache: str = "off"  # "exact" | "semantic" | "miss" | "skip" | "bypass" | "off" (X-Velo-Cache)
    cache_reason: str = ""  # why a request was skipped (X-Velo-Cache-Reason)
    repairs: list[str] = field(default_factory=list)  # X-Velo-Repair
    # repair ran out of its time budget (X-Velo-Repair: skipped=budget): an answer sent as it came because the repair
    # threads were busy is the server's load, not the request's, and the cache keeps none
    unrepaired: bool = False
    tools: str = ""  # how the offered tools reached the model: "native" | "prompt" | "grammar" (X-Velo-Tools)
    trimmed: str = ""  # what was dropped to fit the context, e.g. "3 messages" (X-Velo-Context-Trimmed)
    rate_limit: dict[str, str] = field(default_factory=dict)  # the key's limits, in the dialect's headers
    context_edits: list[Applied] = field(default_factory=list)  # what the edit-context stage cleared
    calls: list[int] = field(default_factory=list)  # each backend call's tokens, where repair asked again
    coalesced: bool = False  # rode on an identical request's backend call: no backend spent a token on it
    # what of a shared backend call it pays for, where that is not what it got: past the chunks another paid for
    # (None: from the start), up to the second (None: to what it got); see Coalescer.stream
    billed: tuple[list[Chunk] | None, list[Chunk] | None] | None = None

    def headers(self) -> dict[str, str]:
        out = {"X-Velo-Cache": self.cache}
        if self.cache_reason:
            out["X-Velo-Cache-Reason"] = self.cache_reason
        if self.repairs:
            out["X-Velo-Repair"] = "; ".join(self.repairs)[:1000]
        if self.tools:
            out["X-Velo-Tools"] = self.tools
        if self.trimmed:
            out["X-Velo-Context-Trimmed"] = self.trimmed
        return out | self.rate_limit


@dataclass(eq=False)
class Parts:
    """One request answered by several jobs (OpenAI's `n`, a completions batch), as the key's limits see it: one
    request, admitted once for all its prompts by the first part to get there, the others waiting for that; held
    until its last part ends. Each part admitted alone, a limit of one at once refused every `n = 2`, a refusal's
    other parts ran (and were charged), and the slot was let go while parts still ran."""

    count: int
    prompt: int  # every part's prompt estimate
    admission: asyncio.Future | None = None  # the first part's: its rate-limit headers, or its refusal
    ended: int = 0

    def first(self) -> bool:
        """True for the part that admits the request (the first to ask)."""
        if self.admission is not None:
            return False
        self.admission = asyncio.get_running_loop().create_future()
        return True

    def leave(self) -> bool:
        """A part ended, or left before it began: True when it was the last and the request holds a slot to let
        go (it was admitted)."""
        self.ended += 1
        done = self.admission is not None and self.admission.done() and not self.admission.cancelled()
        return self.ended == self.count and done and self.admission.exception() is None  # type: ignore[union-attr]


@dataclass
class Job:
    """`request`, `caller` and `dialect` come from the edge; `cache_bypass` too (the client asked Velo itself not to
    use its cache: headers or body, proxy/cache/policy.py). `target` is set by the resolve stage, `outcome` by the
    others. A stage that changes the request passes a copy (`dataclasses.replace`) that shares the outcome."""

    request: Request
    caller: Caller = field(default_factory=Caller)
    dialect: str = "openai"  # "ollama" | "openai" | "anthropic" | "responses": proxy/dialects RULES apply
    cache_bypass: bool = False
    context_edits: tuple[Edit, ...] = ()  # clearing the client asked for (Anthropic's context_management)
    parts: Parts | None = None  # the request this job is one part of, where several answer it (OpenAI's `n`)
    part: int = 0  # which of them
    # Its logprobs are Velo's own, to rank best_of's candidates by: a backend that refuses them is asked again without
    # them in this job, the one request the client made (proxy/best_of.py)
    own_logprobs: bool = False
    # The client's body was large (http_io.parse_body): the stages' work over the whole request (the cache's and
    # coalescing's keys, 0.5 s each for a 28 MB history) runs on a thread
    large: bool = False
    place: Place | None = None  # its place in its backend's queue, taken at the edge (a background response's)
    share: Share | None = None  # its share of its key's limits, taken at the edge with the place
    target: Target | None = None
    outcome: Outcome = field(default_factory=Outcome)

    @property
    def model(self) -> str:
        return self.request.model

    def give_back(self) -> None:
        """What the job took at the edge and its stages did not take from it, given back once it ends: it needed no
        slot (an answer from the cache, or one that rode on an identical request's call), or was refused first."""
        if self.place is not None:
            self.place.controller.give_back(self.place)
        if self.share is not None:
            self.share.limits.give_back(self.share)


async def holding(job: Job, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """`chunks`, the stream of `job`; what it took at the edge and never used is given back once it ends."""
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield chunk
    finally:
        job.give_back()
