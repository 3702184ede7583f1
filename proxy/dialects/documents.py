"""Documents a client attaches (Anthropic's `document` block, OpenAI's `file` and `input_file` parts) as text of the
turn: a PDF's text read with pypdf, a text file as it is. What cannot be read (a scanned page, a broken or oversized
PDF, a URL or an uploaded file's id, neither of which Velo reaches) becomes a short note in its place, not a 400: an
agent's history keeps the document (Claude Code's Read of a PDF), so a 400 would fail every later turn.

Reading a PDF takes pypdf about a millisecond a page of plain text, and more for a real one, so a parse that meets a
large PDF not read before runs again on one of the app's `Documents` threads, where a parse of a large body runs from
the start (http_io.parse_body); the texts read are kept under a digest of the data, since the history, and the PDF
in it, comes again with every turn.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import functools
import io
import itertools
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import pypdf
import xxhash

from adapters.errors import BadRequest
from adapters.fields import get

T = TypeVar("T")
MAX_PDF_BYTES = 32 * 1024 * 1024  # Anthropic's own limits for a PDF: 32 MB and 100 pages
MAX_PAGES = 100
MAX_SECONDS = 10.0  # reading stops at the page that passes this, the pages after it become a note
INLINE_CHARS = 2048  # base64 characters read on the event loop: ~2 ms (a PDF of a few short pages)
_reading: contextvars.ContextVar[tuple[Documents, bool] | None] = contextvars.ContextVar("velo_reading", default=None)


class _OffLoop(Exception):
    """The parse met a PDF too large to read on the event loop."""


class Documents:
    """The app's PDF reading: the texts read, kept (the history brings a PDF again every turn), and the threads that
    read large ones, apart from the default executor the engine's work waits on."""

    def __init__(self, entries: int = 32, threads: int = 2) -> None:
        self.entries, self.kept, self.lock = entries, OrderedDict[bytes, str](), threading.Lock()
        self.threads = ThreadPoolExecutor(threads, "velo-documents")

    async def parse(self, parse: Callable[..., T], *args: Any, apart: bool = False, **kwargs: Any) -> T:
        """`parse(*args, **kwargs)` on the event loop, or again on a thread where it met a large PDF not read before
        (a parse has no effects, so the second one starts over); `apart`, on a thread from the start (a large body's:
        http_io.parse_body). A parse not called through here reads every PDF where it runs, and keeps none."""
        if not apart:
            token = _reading.set((self, True))
            try:
                return parse(*args, **kwargs)
            except _OffLoop:
                pass
            finally:
                _reading.reset(token)
        context = contextvars.copy_context()
        context.run(_reading.set, (self, False))
        return await asyncio.get_running_loop().run_in_executor(
            self.threads, functools.partial(context.run, parse, *args, **kwargs))

    def text(self, data: str, on_loop: bool) -> str:
        key = xxhash.xxh3_128_digest(data.encode())
        with self.lock:
            if key in self.kept:
                self.kept.move_to_end(key)
                return self.kept[key]
        if on_loop and len(data) > INLINE_CHARS:
            raise _OffLoop()
        text = _read(data)
        with self.lock:
            self.kept[key] = text
            if len(self.kept) > self.entries:
                self.kept.popitem(last=False)
        return text

    def close(self) -> None:
        """Reading that runs on ends at its deadline (MAX_SECONDS); no one waits for it."""
        self.threads.shutdown(wait=False, cancel_futures=True)


def titled(text: str, *heads: str) -> str:
    """A document as text of its turn: under its title (and context), apart from the text after it."""
    return "\n\n".join([*(h for h in heads if h), text]) + "\n\n"


def apart(before: str) -> str:
    """What sets a document apart from the text before it."""
    return "\n\n" if before and not before.endswith("\n") else ""


def note(what: str, why: str) -> str:
    return f"[{what} left out: {why}]"


def openai_file(file: Any, where: str, param: str) -> str:
    """An OpenAI file (a chat `file` part's `file`, a Responses `input_file` part) as text under its name: its
    `file_data` read, a `file_url` or `file_id` a note (Velo fetches no URLs and keeps no uploaded files)."""
    if not isinstance(file, dict):
        raise BadRequest(f"{where}: must be an object", param=param)
    name = get(file, "filename", str, "")
    if isinstance(file.get("file_data"), str):
        text = file_text(file["file_data"])
    elif isinstance(file.get("file_url"), str):
        text = note(f"the file at {file['file_url']}", "Velo fetches no URLs")
    elif isinstance(file.get("file_id"), str):
        text = note(f"the file {file['file_id']}", "Velo keeps no uploaded files")
    else:
        raise BadRequest(f"{where}: needs file_data, file_url or file_id", param=param)
    return titled(text, name)


def file_text(data: str, media_type: str = "") -> str:
    """A base64 file's text: a PDF's (by its media type or its first bytes), a text file's, else a note."""
    if data.startswith("data:"):  # a data URL, as OpenAI's file_data comes
        head, _, data = data.partition(",")
        media_type = head[5:].split(";", 1)[0] or media_type
    if media_type.startswith("text/"):
        try:
            return base64.b64decode(data, validate=True).decode("utf-8", "replace")
        except binascii.Error:
            return note("a file", "its data is not valid base64")
    if media_type in ("application/pdf", "") or data.startswith("JVBERi0"):  # %PDF-
        return pdf_text(data)
    return note(f"a file ({media_type})", "Velo reads PDF and text files")


def pdf_text(data: str) -> str:
    """A base64 PDF's text, with notes for what could not be read; kept by the app's `Documents`, where the parse
    runs through it."""
    reading = _reading.get()
    return _read(data) if reading is None else reading[0].text(data, reading[1])


def _read(data: str) -> str:
    if len(data) * 3 // 4 > MAX_PDF_BYTES:
        return note("a PDF", f"over the {MAX_PDF_BYTES >> 20} MB Velo reads")
    try:
        raw = base64.b64decode(data, validate=True)
    except binascii.Error:
        return note("a PDF", "its data is not valid base64")
    try:  # pypdf raises many kinds of errors on a malformed file
        reader = pypdf.PdfReader(io.BytesIO(raw))
        if reader.is_encrypted and not reader.decrypt(""):
            return note("a PDF", "it is encrypted")
        count = len(reader.pages)
        return _pages(reader, count)
    except Exception as e:
        return note("a PDF", f"it could not be read ({type(e).__name__})")


def _pages(reader: pypdf.PdfReader, count: int) -> str:
    """The pages' text, up to the bounds; the pages past them as a note."""
    deadline, texts, tail = time.monotonic() + MAX_SECONDS, [], []
    for n in range(min(count, MAX_PAGES)):
        if time.monotonic() > deadline:
            tail.append(note(_span(n + 1, count), f"reading the pages before took over {MAX_SECONDS:g} s"))
            break
        texts.append(_page(reader, n))
    else:
        if count > MAX_PAGES:
            tail.append(note(_span(MAX_PAGES + 1, count), f"Velo reads the first {MAX_PAGES} pages of a PDF"))
    if texts and not any(texts) and not tail:
        return note("a PDF", f"no text in its {count} page{'s' if count > 1 else ''} (scanned, or pictures)")
    return "\n\n".join([*_noted(texts), *tail]) or note("a PDF", "it has no pages")


def _page(reader: pypdf.PdfReader, n: int) -> str:
    try:
        return reader.pages[n].extract_text().strip()
    except Exception as e:  # one broken page leaves the others
        return note(f"page {n + 1}", f"it could not be read ({type(e).__name__})")


def _noted(texts: list[str]) -> list[str]:
    """The pages' texts, each run of pages with none (a scan, pictures: a model reads those only as images) as a
    note."""
    out = []
    for has_text, run in itertools.groupby(enumerate(texts, 1), key=lambda page: bool(page[1])):
        pages = list(run)
        out += [text for _, text in pages] if has_text else [f"[{_span(pages[0][0], pages[-1][0])}: no text to read]"]
    return out


def _span(first: int, last: int) -> str:
    return f"page {first}" if first == last else f"pages {first}-{last}"
