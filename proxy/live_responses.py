"""Streamed responses being written in the foreground (`stream: true`, `store: true`, not `background`), by (tenant,
response id), each listed until its stream ends: unknown until then, `GET /v1/responses/{id}` and `cancel` were
404s, and a `DELETE` was undone when the stream then stored the response. `GET` reads one in progress with the
items done so far; `cancel` is OpenAI's 400 for a response not in the background; a `DELETE` takes it off the list
and the stream then stores nothing (proxy/routes_responses.py)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .dialects.responses_stream import ResponseStream
from .responses_store import StoredResponse


@dataclass
class Writing:
    """A response being written, by its request's stream (`Live`) or by a task of its own (background.Run)."""

    writer: ResponseStream
    input: list[dict[str, Any]]  # its request's input items, as stored
    previous: str | None  # the id of the response it continues

    def record(self, ended: bool) -> StoredResponse:
        """As it is stored once `ended`, and as `GET` reads it before."""
        return StoredResponse(self.writer.snapshot(ended=ended), self.input, self.previous)


@dataclass
class Live(Writing):
    deleted: bool = False  # by a DELETE while it streamed: it is not stored


@dataclass
class LiveResponses:
    live: dict[tuple[str, str], Live] = field(default_factory=dict)

    def get(self, tenant: str, resp_id: str) -> Live | None:
        return self.live.get((tenant, resp_id))

    @contextmanager
    def listed(self, tenant: str, live: Live) -> Iterator[None]:
        key = (tenant, live.writer.resp_id)
        self.live[key] = live
        try:
            yield
        finally:
            self.live.pop(key, None)

    def delete(self, tenant: str, resp_id: str) -> bool:
        """Whether it was streaming: it is then off the list, and not stored at its end."""
        if (live := self.live.pop((tenant, resp_id), None)) is None:
            return False
        live.deleted = True
        return True
