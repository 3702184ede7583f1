"""Background responses (`background: true` on `POST /v1/responses`), as OpenAI runs them: the answer is written by
a task of its own, so the request returns at once (`status: "queued"`) or streams while the work goes on without
it. A client that dropped its stream follows it again from any event (`GET /v1/responses/{id}?stream=true&
starting_after=N`); `GET` shows it queued or in progress; `cancel` ends it.

The task is listed among the requests in flight under the response's id (`GET /velo/requests`; an admin's `DELETE`
ends it, and shutdown drains it as a request), and keeps the configuration it started on until it ends. Its events
are kept with the stored response, so the numbers a client counted stay valid once the answer is done; a response
with `store: false` is kept for polling only, for `POLL_KEEP_S`.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import zlib
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

from adapters.errors import BackendError, VeloError
from adapters.protocol import Chunk

from .generation import Generation
from .inflight import InFlight, Running, uncancel
from .live_responses import Writing
from .responses_store import StoredResponse

log = logging.getLogger("velo.background")
POLL_KEEP_S = 600.0  # a background response with store: false: OpenAI keeps it "about 10 minutes" for polling
Store = Callable[[StoredResponse], Awaitable[None]]


def pack_events(log: list[bytes]) -> str:
    """A stream's events as stored: zlib (level 1, off the event loop), then base64 for the JSON of the store's
    tiers. Each event repeats its type, ids and indexes around a token or two: the 4.7 MB of a 20,000-piece answer's
    events pack into 0.31 MB (15x smaller; the last four events each repeat the whole text). Kept as they were, a
    background response stored 41x the bytes of the same one without background; packed, 4.2x
    (bench/background.py)."""
    return base64.b64encode(zlib.compress(b"".join(log), 1)).decode()


def unpack_events(packed: str) -> list[bytes]:
    """The events, one entry each: an event ends with a blank line, and its JSON (orjson's) holds no line break."""
    return [event + b"\n\n" for event in zlib.decompress(base64.b64decode(packed)).split(b"\n\n")[:-1]]


@dataclass
class Run(Writing):
    """One background response being written. Its events are released to followers as they come, except the last
    ones, which wait until the response is stored: a client that continued at once (`previous_response_id`) found
    nothing."""

    task: asyncio.Task | None = None
    released: int = 0  # events followers may send
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def snapshot(self) -> StoredResponse:
        """In progress until it is stored, as its last events: a client that polled it completed and continued at
        once (`previous_response_id`) found nothing."""
        return self.record(ended=self.done)

    def release(self) -> None:
        assert self.writer.log is not None
        self.released = len(self.writer.log)
        self.changed.set()
        self.changed = asyncio.Event()

    async def follow(self, after: int, heartbeat_s: float) -> AsyncIterator[bytes]:
        """The events after number `after`, as they are released, until the response ends. A wait of
        `heartbeat_s` with no event adds one (`response.in_progress`) that every follower gets: Codex's idle timer
        counts events (responses_stream.py)."""
        assert self.writer.log is not None
        at = after + 1
        while True:
            if at < self.released:
                yield b"".join(self.writer.log[at:self.released])
                at = self.released
            elif self.done:
                return
            else:
                try:
                    async with asyncio.timeout(heartbeat_s or None):
                        await self.changed.wait()
                except TimeoutError:
                    if self.writer.final is None:
                        self.writer.encode(Chunk(heartbeat=True))
                        self.release()


@dataclass
class BackgroundRuns:
    """The background responses being written, by (tenant, response id): each key sees only its own."""

    runs: dict[tuple[str, str], Run] = field(default_factory=dict)

    def get(self, tenant: str, resp_id: str) -> Run | None:
        return self.runs.get((tenant, resp_id))

    def start(self, tenant: str, client: str, run: Run, chunks: AsyncIterator[Chunk], store: Store,
              inflight: InFlight, generation: Generation) -> None:
        """Writes `chunks` into `run` in a task of its own, listed as `tenant`'s request under the response's id."""
        key = (tenant, run.writer.resp_id)
        generation.enter()
        run.task = asyncio.create_task(self._write(run, chunks, store, inflight, tenant, client))
        self.runs[key] = run
        run.task.add_done_callback(lambda _: (self.runs.pop(key, None), generation.leave()))

    async def _write(self, run: Run, chunks: AsyncIterator[Chunk], store: Store, inflight: InFlight, tenant: str,
                     client: str) -> None:
        writer = run.writer
        task = asyncio.current_task()
        assert task is not None
        entry = Running(writer.resp_id, "POST", "/v1/responses", client, tenant, task)
        with inflight.listed(entry):  # while it is written: what ends a request ends it
            try:
                async with aclosing(chunks):
                    async for chunk in chunks:
                        writer.encode(chunk)
                        if writer.final is None:
                            run.release()
                writer.finish()
            except VeloError as e:
                writer.fail(e)
            except asyncio.CancelledError:
                uncancel()  # the cancel is this task's way to end; storing the response still has to run
                writer.cancel(entry.reason)
            except Exception as e:  # a fault of Velo's own: the response fails rather than staying queued forever
                log.exception("background response %s failed", writer.resp_id)
                writer.fail(BackendError(f"the response failed inside Velo: {type(e).__name__}"))
        assert writer.final is not None and writer.log is not None
        try:  # not listed, so no cancel cuts it: a store cut halfway lost a finished answer from SQLite or Redis
            await store(StoredResponse(writer.final, run.input, run.previous,
                                       await asyncio.to_thread(pack_events, writer.log)))
        except Exception:  # a shared tier down: no one awaits this task, and this process still has it in memory
            log.exception("background response %s could not be stored", writer.resp_id)
        finally:
            run.done = True
            run.release()

    async def close(self) -> None:
        """With the app: whatever is still written is cancelled (and stored as such); what is being stored is
        waited for."""
        tasks = [run.task for run in self.runs.values() if run.task is not None]
        for run in self.runs.values():
            if run.writer.final is None and run.task is not None:
                run.task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
