"""Where a region that may hold a tool call ends, searched incrementally: each search keeps where it stopped, so a
stream's next chunk continues it instead of starting over. Holding back a long region then costs linear time;
re-scanning it from its start at every chunk was quadratic (32,768 `{` in 16-character chunks took 12.7 s of the
event loop before)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

_OUTSIDE = re.compile(r'[{\[]+|[}\]]+|"')  # runs of brackets count at once: 2 MB of `{` is one match
_INSIDE = re.compile(r'["\\]')


class EndSearch(Protocol):
    def find(self, text: str) -> tuple[int, int] | None:
        """(end of the body, end of the region) in `text`, or None while `text` does not hold the end yet. `text`
        is the one searched before, extended."""


@dataclass
class Closer:
    """A region closed by a fixed string (`</tool_call>`, `</function>`, a fence's ```)."""

    closer: str
    pos: int

    def find(self, text: str) -> tuple[int, int] | None:
        j = text.find(self.closer, self.pos)
        if j >= 0:
            return j, j + len(self.closer)
        self.pos = max(self.pos, len(text) - len(self.closer) + 1)
        return None


@dataclass
class Pattern:
    """A region closed by any of several markers (Llama's end-of-turn tokens), `longest` characters at most."""

    pattern: re.Pattern[str]
    longest: int
    pos: int

    def find(self, text: str) -> tuple[int, int] | None:
        m = self.pattern.search(text, self.pos)
        if m is not None:
            return m.start(), m.end()
        self.pos = max(self.pos, len(text) - self.longest + 1)
        return None


@dataclass
class Brackets:
    """A JSON value: its brackets balance outside double-quoted strings (escapes honoured)."""

    pos: int
    depth: int = 0
    in_string: bool = False
    end: int | None = None

    def find(self, text: str) -> tuple[int, int] | None:
        if self.end is not None:
            return self.end, self.end
        pos, size = self.pos, len(text)
        while pos < size:
            if self.in_string:
                m = _INSIDE.search(text, pos)
                if m is None:
                    pos = size
                elif m.group() == "\\":
                    if m.end() == size:
                        pos = m.start()  # the escaped character is still to come: look at this backslash again
                        break
                    pos = m.end() + 1
                else:
                    self.in_string, pos = False, m.end()
                continue
            m = _OUTSIDE.search(text, pos)
            if m is None:
                pos = size
                continue
            tok, pos = m.group(), m.end()
            if tok == '"':
                self.in_string = True
            elif tok[0] in "{[":
                self.depth += len(tok)
            elif len(tok) >= self.depth:
                self.end = m.start() + self.depth
                return self.end, self.end
            else:
                self.depth -= len(tok)
        self.pos = pos
        return None
