"""One backend served by several identical servers (`urls = [...]` in config.toml).

Each request goes to the healthy replica with the fewest outstanding requests, or, with prefix affinity, to the
replica its conversation prefix hashes to (so the server's prompt cache is reused) unless that one is clearly
busier than the rest. A replica that fails before sending its first chunk, or lacks the model (a pull missed it),
is skipped and the next one tried, so the client never sees the failure, unless it may have run the request (it
read it, then dropped the connection or cut its answer: `BackendError.taken`); once bytes went out the error is the
client's. A replica loading its model is passed over for a ready one; when all are loading, the request waits for
one, as for a single backend. Repeated failures open the replica's circuit for a cool-down (it gets no requests);
after it, the next failure reopens it at once. A probe at start, then every `health_interval_s`, keeps `healthy`
(the set serves once one replica passes its first, the others joining as theirs pass); replicas failing it are tried
only when no healthy one is left. The set lists what its healthy replicas list, together. Velo's queue in front of
the set takes the slots of the replicas in service (`ReplicaSet.slots`), told anew as replicas leave and come back.

Replica settings live in the backend's `options`: `affinity` ("prefix" or "none"), `health_interval_s`,
`breaker_failures`, `breaker_cooldown_s`; they are stripped before the options reach the replicas' adapters.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Literal, TypeVar

import xxhash

from .base import Backend, BackendConfig, start_all
from .errors import (BackendError, BackendTimeout, BackendUnavailable, ModelNotFound, Overloaded, Unsupported,
                     VeloError)
from .http import LOADING_POLL_S, Loading, Upstream, asked_of, one_answer
from .schema import build, setting
from .protocol import ChatRequest, Chunk, CompletionRequest, EmbedRequest, EmbedResult, ModelInfo, RunningModel
from .wording import counted

if TYPE_CHECKING:
    from aiohttp import StreamReader

log = logging.getLogger("velo.replicas")
T = TypeVar("T")
M = TypeVar("M", ModelInfo, RunningModel)
# Worth another replica: a replica lacks a model the others have when a pull or delete missed it (its circuit was
# open, or it was down); any other 4xx would fail the same everywhere
_RETRYABLE = (BackendError, Overloaded, ModelNotFound)
# After the first replica's listing (or slots), how long the others' are waited for: they answer together (a listing
# takes a few ms), and the router gives the whole set 3 s (the admit stage, its slots 5 s)
_LISTING_GRACE_S = 0.5
_AFFINITY_SLACK = 2  # outstanding requests the preferred replica may have beyond the least busy one


@dataclass
class ReplicaOptions:
    """A backend with `urls = [...]` sends each request to the healthy replica with the fewest requests
    outstanding, fails over before the first byte (not a request the replica may have run: it read it, then dropped
    the connection), passes over a replica loading its model, asks one that said it is busy (a 429 or 503 with
    Retry-After) after the others until then, and opens a replica's circuit after repeated failures
    (when every replica fails, the client gets a 504 if each timed out, a 429 if each was busy, else a 503); these
    keys of its `options` tune that."""

    affinity: Literal["none", "prefix"] = setting(
        "none", '"prefix" keeps a conversation on one replica (its prompt cache); "none" picks the least busy')
    health_interval_s: float = setting(5.0, "seconds between health probes", min=0.1)
    breaker_failures: int = setting(3, "consecutive failures that open a replica's circuit", min=1)
    breaker_cooldown_s: float = setting(10.0, "seconds an open circuit keeps the replica out", min=0)

    @classmethod
    def split(cls, options: dict[str, Any], path: str = "options") -> tuple["ReplicaOptions", dict[str, Any]]:
        """(the replica settings, the options left for each replica's adapter); SchemaError naming a bad key."""
        names = {f.name for f in fields(cls)}
        ours = build(cls, {k: v for k, v in options.items() if k in names}, path)
        return ours, {k: v for k, v in options.items() if k not in names}


@dataclass(eq=False)
class Replica:
    backend: Backend
    outstanding: int = 0
    healthy: bool = True
    failures: int = 0  # consecutive
    open_until: float = 0.0  # circuit open (skipped) until this monotonic time
    busy_until: float = 0.0  # it said busy (a 429 or 503 with Retry-After): tried after the others until then
    slots: int | None = None  # what it reported (`concurrency`, or its probe passing); None until it has

    def closed(self, now: float) -> bool:
        """The circuit lets requests through."""
        return self.open_until <= now

    def in_service(self) -> bool:
        """Its slots count toward the set's: it passes its probes and its circuit has not opened since its last
        success. Out of its cool-down it is tried again (`order`), and counted again once a request succeeds there:
        counted at once, a replica still broken drew a burst of queued requests that all failed over to the others,
        past their slots."""
        return self.healthy and not self.open_until

    def succeeded(self) -> bool:
        """True where its circuit had opened: it is back in service."""
        was_open = self.open_until != 0.0
        self.failures, self.open_until = 0, 0.0
        return was_open

    def failed(self, opts: ReplicaOptions) -> None:
        self.failures += 1
        if self.failures >= opts.breaker_failures:
            self.open_until = time.monotonic() + opts.breaker_cooldown_s
            log.warning("replica %s: circuit open for %.0fs after %s", self.backend.name,
                        opts.breaker_cooldown_s, counted(self.failures, "failure"))


def _first_replicas(trait: str) -> Any:
    return property(lambda self: getattr(self.replicas[0].backend, trait))


class ReplicaSet(Backend):
    # traits of the servers the set stands for, which are identical: its first replica's
    fits_context = _first_replicas("fits_context")
    refuses_output_past_window = _first_replicas("refuses_output_past_window")
    answers_unlisted_names = _first_replicas("answers_unlisted_names")
    shows_every_model = _first_replicas("shows_every_model")
    forces_tool_choice = _first_replicas("forces_tool_choice")
    constrains_format = _first_replicas("constrains_format")
    own_defaults = _first_replicas("own_defaults")

    def __init__(self, config: BackendConfig, replicas: list[Backend], options: ReplicaOptions | None = None):
        super().__init__(config)
        assert replicas, "a replica set needs at least one replica"
        self.options = options or ReplicaOptions()
        self.replicas = [Replica(b) for b in replicas]
        self._prober: asyncio.Task | None = None
        self._resize: Callable[[int], None] | None = None  # `watch_slots`
        self._slots: int | None = None  # the slots last said (`concurrency`, `_recount`)
        for member in replicas:  # one loading its model is passed over for a ready one, not waited for (300 s)
            if isinstance(upstream := getattr(member, "http", None), Upstream):
                upstream.waits_for_loads = False

    @classmethod
    def from_config(cls, config: BackendConfig, make: Callable[[BackendConfig], Backend]) -> "ReplicaSet":
        opts, rest = ReplicaOptions.split(config.options)
        members = [make(replace(config, name=f"{config.name}[{i}]", urls=[url], options=rest))
                   for i, url in enumerate(config.urls)]
        return cls(config, members, opts)

    async def start(self) -> None:
        """Serves once a replica passes its first probe, and the others answering within `_LISTING_GRACE_S` of it
        have (or every first probe has ended, none passing); each replica is out of service until its own passes,
        and one still unanswered joins when it does. Counted healthy, one down when Velo started held its slots in
        the set's and drew the first requests (each failing over); every probe waited for, one that accepted and
        never answered held the start for the probe's bound, `health_interval_s`, the others ready."""
        await start_all(r.backend for r in self.replicas)
        for replica in self.replicas:
            replica.healthy = False
        loop = asyncio.get_running_loop()
        passed, probed = loop.create_future(), loop.create_future()
        self._prober = asyncio.create_task(self._probe_forever(passed, probed), name=f"health:{self.name}")
        try:  # or the prober's end: one ended by a fault leaves no start waiting for good (close raises it)
            await asyncio.wait([passed, probed, self._prober], return_when=asyncio.FIRST_COMPLETED)
            await asyncio.wait([probed, self._prober], timeout=_LISTING_GRACE_S, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (a Ctrl-C, a refused reload): its probes do not outlive it
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
            raise

    async def close(self) -> None:
        self._resize = None  # a queue kept through a reload is the next configuration's set's to size
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
        await asyncio.gather(*(r.backend.close() for r in self.replicas), return_exceptions=True)

    async def probe(self, passed: asyncio.Future[None] | None = None) -> None:
        """Asks every replica for its health once, each taken as it answers (`_probe_one`), so that one hung holds
        none of the others' up to the probe's bound; `passed` is resolved at the first that passes."""
        await asyncio.gather(*(self._probe_one(r, passed) for r in self.replicas))

    async def _probe_one(self, replica: Replica, passed: asyncio.Future[None] | None) -> None:
        """A replica that recovers gets its circuit closed, and one passing that never said its slots (down when the
        set was asked them) is asked them now: it counted as the configured limit or 4 for good, so a llama-server
        of 1 slot back from a restart took 4 requests at once."""
        wait = self.options.health_interval_s
        ok = await _probe(replica.backend, wait)
        if ok and not replica.healthy:
            replica.succeeded()
        replica.healthy = ok
        if ok and replica.slots is None:
            await self._ask_slots([replica], wait)
        self._recount()
        if ok and passed is not None and not passed.done():
            passed.set_result(None)

    async def _probe_forever(self, passed: asyncio.Future[None], probed: asyncio.Future[None]) -> None:
        """The first round resolves `passed` at the first replica passing, and `probed` at its end."""
        await self.probe(passed)
        probed.set_result(None)
        while True:
            await asyncio.sleep(self.options.health_interval_s)
            await self.probe()

    async def health(self) -> bool:
        return any(r.healthy for r in self.replicas)

    async def concurrency(self) -> int:
        """The slots of the replicas in service (`slots`), as each replica reports its own: Velo's admission queue
        sits in front of the whole set. When none can say, the error of one, so that the admit stage asks again
        until they do. Each replica is asked within the probe's bound, `health_interval_s` (`_ask_slots`)."""
        answers = await self._ask_slots(self.replicas, self.options.health_interval_s)
        if all(isinstance(n, BaseException) for n in answers):
            raise answers[0]
        self._slots = self.slots()
        return self._slots

    async def _ask_slots(self, replicas: list[Replica], timeout: float) -> list[int | BaseException]:
        """What each replica reports of its slots (`concurrency`), or its error; kept in `Replica.slots` where said.
        One silent past `timeout`, or `_LISTING_GRACE_S` after the first said (they answer together: /props takes a
        few ms), is a TimeoutError and keeps what it said before (the configured limit or 4 where it never did, until
        its next passing probe): waited for, one that accepted and never answered held the set's answer past the
        admit stage's 5 s bound, so that the set's queue was never sized from the others, asked again in vain."""
        asks = [asyncio.ensure_future(asyncio.wait_for(r.backend.concurrency(), timeout)) for r in replicas]
        silent = await _answered(asks)
        answers: list[int | BaseException] = [
            TimeoutError(f"{r.backend.name} did not say its slots in time") if t in silent else
            t.exception() or t.result() for r, t in zip(replicas, asks)]
        for replica, n in zip(replicas, answers):
            if isinstance(n, int):
                replica.slots = n
        return answers

    def slots(self) -> int:
        """The slots of the replicas in service added up (one that never said, down, until its probe passes: its
        configured limit or 4, as a single backend's); one replica's worth when none is, so that requests still come
        to try them (and fail over, or fast). The sum of all, with one replica out, sent its share to the others at
        once, which queued it in their own queues, outside Velo's order and its `queue_timeout_s`."""
        fallback = self.config.max_concurrency or 4
        each = [(fallback if r.slots is None else r.slots, r.in_service()) for r in self.replicas]
        return sum(n for n, serves in each if serves) or max(n for n, _ in each)

    def watch_slots(self, resize: Callable[[int], None]) -> None:
        self._resize = resize
        self._recount()

    def _recount(self) -> None:
        """Tells the watcher the set's slots where they changed: a replica's circuit opened or closed, or its
        probes failed or passed again."""
        slots = self.slots()
        if self._resize is not None and slots != self._slots:
            log.info("backend %r: %s in service", self.name, counted(slots, "slot"))
            self._slots = slots
            self._resize(slots)

    def order(self, affinity_key: str | None = None) -> list[Replica]:
        """Replicas to try, best first: healthy ones by outstanding requests (the affinity replica first when it
        is not much busier), those that said they are busy for a while after them, then those failing probes. Open
        circuits are left out; none left is a 503. A replica that answered 429 with Retry-After 9 was asked first,
        a round trip more, by every request in those 9 s."""
        now = time.monotonic()
        closed = [r for r in self.replicas if r.closed(now)]
        if not closed:
            wait = min(r.open_until for r in self.replicas) - now
            raise BackendUnavailable(f"every replica of backend {self.name!r} is failing", retry_after=wait)
        ready = sorted((r for r in closed if r.healthy), key=lambda r: (r.busy_until > now, r.outstanding))
        if affinity_key is not None and ready:
            preferred = max(ready, key=lambda r: xxhash.xxh64_intdigest(f"{affinity_key}|{r.backend.name}".encode()))
            if preferred.outstanding <= ready[0].outstanding + _AFFINITY_SLACK and preferred.busy_until <= now:
                ready.remove(preferred)
                ready.insert(0, preferred)
        return ready + [r for r in closed if not r.healthy]

    # A one-answer request is asked of the replica as a stream and folded here, above the failover: each replica's
    # own fold made its whole answer the "first chunk", so one that failed mid-generation had the request sent
    # again to the next.
    def chat(self, req: ChatRequest) -> AsyncIterator[Chunk]:
        asked = asked_of(req, self.config)
        stream = self._stream(lambda b: b.chat(asked), self._affinity(req))
        return stream if asked is req else one_answer(stream)

    def complete(self, req: CompletionRequest) -> AsyncIterator[Chunk]:
        asked = asked_of(req, self.config)
        stream = self._stream(lambda b: b.complete(asked), self._affinity(req))
        return stream if asked is req else one_answer(stream)

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        return await self._call(lambda b: b.embed(req), waits_for_loads=True)

    async def list_models(self) -> list[ModelInfo]:
        """What the replicas list: the set's listing was one replica's, so a model a pull had missed on it (its
        circuit open, or down) was a 404 though the others had it (a request fails over to one that has)."""
        return await self._union_of(self._listed)

    async def _listed(self, member: Backend) -> list[ModelInfo]:
        """One replica's listing. What it tells of the server (vLLM's or SGLang's `owned_by`) is true of all: only the
        one that listed knew it, so a vLLM prefill was continued on one replica and answered as a new turn on the
        next, and only one got each key's `cache_salt`."""
        models = await member.list_models()
        if hasattr(member, "server"):
            for replica in self.replicas:
                replica.backend.server = member.server  # type: ignore[attr-defined]
        return models

    async def show(self, model: str, verbose: bool = False) -> ModelInfo:
        return await self._call(lambda b: b.show(model, verbose))

    async def running(self) -> list[RunningModel]:
        """The models loaded on the replicas (Ollama's /api/ps), not one replica's."""
        return await self._union_of(lambda b: b.running())

    async def _union_of(self, listing: Callable[[Backend], Awaitable[list[M]]]) -> list[M]:
        """Each model once, of the replicas' listings: the healthy replicas' (those failing probes only when none is
        healthy), each answer or failure counted as a request's. A replica still silent `_LISTING_GRACE_S` after
        the first answered is left out: waited for, one that hung held the set's whole listing past the router's
        3 s, and the set went unlisted."""
        replicas = self.order()
        asked = {asyncio.ensure_future(listing(r.backend)): r for r in [r for r in replicas if r.healthy] or replicas}
        silent, listings = await _answered(list(asked)), []
        for task, replica in asked.items():
            if task in silent:
                continue
            if (error := task.exception()) is not None:
                self._failed(replica, error)
                continue
            self._succeeded(replica)
            listings.append(task.result())
        if not listings:
            raise next(t.exception() for t in asked if t.done() and not t.cancelled())  # type: ignore[misc]
        seen: dict[str, M] = {}
        for models in listings:
            for model in models:
                seen.setdefault(model.name, model)  # as the first listing that has it says
        return list(seen.values())

    async def manage(self, method: str, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Ollama's model management (/api/pull, /api/create, /api/delete, ...) on each replica whose circuit is
        closed, in turn, its statuses as they come: done on one, a model pulled there was a 404 on the other, which
        no failover covered. A replica that fails ends the stream with its error, naming it."""
        now = time.monotonic()
        if skipped := [r.backend.name for r in self.replicas if not r.closed(now)]:
            log.warning("%s %s not done on %s: its circuit is open", method, path, ", ".join(skipped))
        for replica in self.order():
            async with contextlib.aclosing(replica.backend.manage(method, path, body)) as statuses:
                async for status in statuses:
                    yield status

    async def load(self, model: str, keep: Any) -> int:
        """Ollama's bare load request, on every replica whose circuit is closed (any may take the next request);
        the slowest's time. One that is down does not fail the others' (only all failing is an error)."""
        return max(await self._on_each(lambda b: b.load(model, keep)))

    async def unload(self, model: str) -> None:
        """Ollama's `keep_alive: 0`, on every replica whose circuit is closed: the set's default reached none."""
        await self._on_each(lambda b: b.unload(model))

    async def _on_each(self, fn: Callable[[Backend], Awaitable[T]]) -> list[T]:
        """`fn` of every available replica at once, the results of those that answered; the first error when none
        did."""
        replicas = self.order()
        done = await asyncio.gather(*(fn(r.backend) for r in replicas), return_exceptions=True)
        for replica, result in zip(replicas, done):
            if isinstance(result, BaseException):
                self._failed(replica, result)  # said, and counted toward its circuit
        answered = [r for r in done if not isinstance(r, BaseException)]
        if not answered:
            raise next(e for e in done if isinstance(e, BaseException))
        return answered

    async def blob(self, method: str, digest: str, body: StreamReader | None) -> int:
        """An upload arrives once and is kept nowhere, so it cannot reach each replica as /api/create then must."""
        raise Unsupported(f"backend {self.name!r} is a set of replicas: an uploaded file would reach only one of them; "
                          "create a model from a file on each Ollama server itself (`OLLAMA_HOST=<its address> "
                          "ollama create ...`)")

    def native(self, method: str, path: str, body: dict[str, Any] | None) -> AsyncIterator[bytes]:
        """llama-server's own routes (`/tokenize`, `/infill`, ...), of one replica, failed over as a generation is:
        a set of llama-servers had none (a 404)."""
        return self._stream(lambda b: b.native(method, path, body), None)

    async def count_tokens(self, req: ChatRequest | CompletionRequest) -> int | None:
        """A replica's own count (the fit stage's window, Anthropic's count_tokens): the set's was an estimate."""
        return await self._call(lambda b: b.count_tokens(req), waits_for_loads=True)

    def _affinity(self, req: ChatRequest | CompletionRequest) -> str | None:
        """The conversation's opening (everything up to the first user turn), or a prompt's first 512 chars (or 128
        token ids)."""
        if self.options.affinity != "prefix":
            return None
        if isinstance(req, CompletionRequest):
            return f"{req.model}|{req.prompt[:512] if req.prompt_ids is None else req.prompt_ids[:128]}"
        opening = []
        for m in req.messages:
            opening.append(f"{m.role}:{m.content}")
            if m.role == "user":
                break
        return f"{req.model}|" + "\n".join(opening)

    async def _call(self, fn: Callable[[Backend], Awaitable[T]], waits_for_loads: bool = False) -> T:
        """A plain call, tried on each replica in turn while the failure is one another replica might not have;
        `waits_for_loads` where one backend would (its POSTs: embeddings, a count), not for a listing."""
        until = time.monotonic() + (self.config.first_token_timeout if waits_for_loads else 0)
        while True:
            errors: list[VeloError] = []
            for replica in self.order():
                replica.outstanding += 1
                try:
                    result = await fn(replica.backend)
                except _RETRYABLE as e:
                    self._tried(replica, e, errors)
                    continue
                finally:
                    replica.outstanding -= 1
                self._succeeded(replica)
                return result
            await self._after_all_failed(errors, until)

    async def _stream(self, open_stream: Callable[[Backend], AsyncIterator[Chunk]], key: str | None
                      ) -> AsyncIterator[Chunk]:
        """Fails over until a replica yields its first chunk; from then on, that replica's stream is the answer."""
        until = time.monotonic() + self.config.first_token_timeout
        while True:
            errors: list[VeloError] = []
            for replica in self.order(key):
                replica.outstanding += 1
                stream: AsyncIterator[Chunk] | None = None
                try:
                    stream = open_stream(replica.backend)  # may raise at once (a client's bad template): counted too
                    try:
                        first = await stream.__anext__()
                    except StopAsyncIteration:
                        self._succeeded(replica)
                        return
                    except _RETRYABLE as e:
                        self._tried(replica, e, errors)
                        continue
                    yield first
                    try:
                        async for chunk in stream:
                            yield chunk
                    except BackendError as e:  # mid-stream: too late to hide it
                        self._failed(replica, e)
                        raise
                    self._succeeded(replica)
                    return
                finally:
                    replica.outstanding -= 1
                    if stream is not None:
                        await stream.aclose()  # type: ignore[attr-defined]
            await self._after_all_failed(errors, until)

    def _tried(self, replica: Replica, error: VeloError, errors: list[VeloError]) -> None:
        """A replica's failure before its answer: noted, and the next replica tried, unless this one may have run
        the request (errors.py `taken`): then its error is the client's."""
        self._failed(replica, error)
        if getattr(error, "taken", False):
            raise error
        errors.append(error)

    async def _after_all_failed(self, errors: list[VeloError], until: float) -> None:
        """Every replica failed: when each is loading its model (or lacks it, beside one loading it), a pause before
        they are asked again, as one backend waits for its load (up to `first_token_timeout`); else what went wrong
        with them all."""
        loading = any(isinstance(e, Loading) for e in errors)
        if not loading or not all(isinstance(e, (Loading, ModelNotFound)) for e in errors) or \
                time.monotonic() + LOADING_POLL_S > until:
            raise self._every_failed(errors) from errors[-1]
        await asyncio.sleep(LOADING_POLL_S)

    def _every_failed(self, errors: list[VeloError]) -> VeloError:
        """What the client is told when each replica tried failed: a 404 when none has the model, a 504 when each
        timed out, a 429 when each was busy, else a 503, each with the soonest `Retry-After` a replica gave; one
        status for all hid a hung set behind "down"."""
        what = f"every replica of backend {self.name!r} failed: {errors[-1]}"
        if all(isinstance(e, ModelNotFound) for e in errors):
            return errors[-1]
        if all(isinstance(e, BackendTimeout) for e in errors):
            return BackendTimeout(what)
        soonest = min((e.retry_after for e in errors if e.retry_after is not None), default=None)
        if all(isinstance(e, Overloaded) for e in errors):
            return Overloaded(what, retry_after=soonest)
        return BackendUnavailable(what, retry_after=soonest)

    def _succeeded(self, replica: Replica) -> None:
        if replica.succeeded():
            self._recount()

    def _failed(self, replica: Replica, error: BaseException) -> None:
        log.warning("replica %s failed: %s", replica.backend.name, error)
        if (wait := getattr(error, "retry_after", None)) is not None:
            replica.busy_until = time.monotonic() + wait
        if isinstance(error, BackendError) and not isinstance(error, Loading):  # busy or loading is not broken
            replica.failed(self.options)
            self._recount()


async def _probe(backend: Backend, timeout: float) -> bool:
    try:
        return await asyncio.wait_for(backend.health(), timeout)
    except Exception:  # noqa: BLE001 - a probe reports, it does not raise
        return False


async def _answered(asks: list[asyncio.Future]) -> set[asyncio.Future]:
    """Waits for the replicas' answers until each is in, or `_LISTING_GRACE_S` after the first that is not an error;
    the asks still out then are cancelled, and returned."""
    loop, pending, until = asyncio.get_running_loop(), set(asks), None
    try:
        while pending:
            wait = None if until is None else max(0.0, until - loop.time())
            done, pending = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break
            if until is None and any(task.exception() is None for task in done):
                until = loop.time() + _LISTING_GRACE_S
    finally:
        for task in pending:
            task.cancel()
    return pending
