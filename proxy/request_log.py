"""Two log lines per streamed generation request (logger `velo.requests`, INFO): one when its answer starts (the
first chunk, before the client sees a byte) and one when it ends, with its outcome: done, cancelled by client, or the
error. A request for one answer gets the end line only, which carries the cache's part and the prompt of the start
line: its answer starts whole, just before it ends, and a line cost ~45 us of a short request's ~800 at max req/s.
A request that ends before its answer starts (an error, a client that left) has the prompt on its end line.
A request Velo ended itself (an admin's cancel, a shutdown) says so, where it read "cancelled by client".
The access log alone writes a line only once a response is whole, so a long stream shows nothing until it
ends and a request the client abandons shows nothing at all. With `[server] log_prompts`, the start line carries
the prompt (the last user turn, or a completion's prompt) and the end line the answer, each cut at
`_TEXT_CHARS` characters; off (the default), only sizes and timings are logged."""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field

from adapters.errors import VeloError
from adapters.protocol import Chunk
from adapters.wording import counted

log = logging.getLogger("velo.requests")
_numbers = itertools.count(1)
_TEXT_CHARS = 2000  # a coding agent resends ~76 KB a turn; the tail of a line that long helps nobody


@dataclass
class RequestLine:
    """One request's log lines: `chunk` for each chunk on its way out, `end` once, whatever ended it."""

    path: str
    model: str
    backend: str
    prompt: str | None = None  # only with log_prompts
    streamed: bool = True  # False: one answer, one line
    # the request's id (X-Velo-Request-Id), which the long-request warning, /velo/requests and shutdown name too;
    # a number where it has none
    name: str = field(default_factory=lambda: f"#{next(_numbers)}")
    started: float = field(default_factory=time.perf_counter)
    begun: bool = False
    tokens: int = 0
    finish: str | None = None
    opening: str = ""  # what a one-answer request's start line would have said after its timing, for its end line
    answer: list[str] = field(default_factory=list)

    def chunk(self, chunk: Chunk, cache: str) -> None:
        if not self.begun:
            self.begun = True
            if not self.streamed:
                self.opening = f" (cache {cache}){_text('prompt', self.prompt)}"
            else:
                log.info("%s %s %s on %s: answer started after %.3fs (cache %s)%s", self.name, self.path, self.model,
                         self.backend, self._elapsed(), cache, _text("prompt", self.prompt))
        self.tokens = chunk.usage.completion_tokens if chunk.usage is not None else self.tokens + bool(chunk.text)
        self.finish = chunk.finish_reason or self.finish
        if self.prompt is not None:
            self.answer.append(chunk.text)

    def end(self, status: str, error: BaseException | None, ended_by: VeloError | None = None) -> None:
        """`ended_by`: why Velo cancelled the request itself (an admin, a shutdown), if it did."""
        answer = "".join(self.answer) if self.prompt is not None else None
        if status == "200":
            outcome = f"done ({self.finish or 'stop'})"
        elif status == "499":
            outcome = f"cancelled: {ended_by.message}" if ended_by is not None else "cancelled by client"
        else:
            said = error.logged(answer is not None) if isinstance(error, VeloError) else repr(error)
            outcome = f"error {status}: {said}"
        level = logging.WARNING if status not in ("200", "499") else logging.INFO
        opening = self.opening if self.begun else _text("prompt", self.prompt)  # no start line said it
        log.log(level, "%s %s %s on %s: %s after %.3fs, %s%s%s", self.name, self.path, self.model, self.backend,
                outcome, self._elapsed(), counted(self.tokens, "token"), opening, _text("answer", answer))

    def _elapsed(self) -> float:
        return time.perf_counter() - self.started


def _text(label: str, text: str | None) -> str:
    if text is None:
        return ""
    cut = text[:_TEXT_CHARS] + ("..." if len(text) > _TEXT_CHARS else "")
    return f"; {label}: {cut!r}"
