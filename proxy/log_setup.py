"""How `velo serve` logs: one format for every logger, records that gather only what it prints, and an access
log line as aiohttp's default writes it, written for less.

Logging was the largest single cost of a short request: its three lines (the access line and the two of
proxy/request_log.py) took 164 us of the 867 us of CPU a request cost Velo at max req/s (against the zero-work
upstream, lines off against on, interleaved). A record gathers what the format may print: the caller's file and
line (a walk up the stack), the thread's and the process's names. Velo's format prints none of them, and leaving
them out (the logging HOWTO's "Optimization" table) saved 65 us a request. aiohttp's own access logger builds each
line through a generic format table and a timezone-aware datetime; `AccessLog` writes the same line directly, with
the time formatted once a second: 58 us less.
"""
from __future__ import annotations

import functools
import logging
import time

from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_CLF_TIME = "[%d/%b/%Y:%H:%M:%S %z]"  # the common log format's, as aiohttp's access line writes it


def configure_logging(level: str) -> None:
    """Every logger to standard error in `FORMAT`, from `level` up, records without what `FORMAT` leaves out."""
    handler = logging.StreamHandler()
    handler.setFormatter(LineFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
    logging.getLogger("aiohttp.server").addFilter(malformed_http)
    logging._srcfile = None  # type: ignore[attr-defined]  # no caller lookup: no %(filename)s, %(lineno)d
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


def malformed_http(record: logging.LogRecord) -> bool:
    """A client's malformed HTTP (a bad request line, header or chunk size), which aiohttp answers with a 400 and
    logs as a server ERROR with its traceback, as one INFO line, as nginx logs it: a port scanner filled the log with
    tracebacks. The line names what was wrong, not the bytes aiohttp quotes: a header line could carry a key."""
    error = record.exc_info[1] if record.exc_info else None
    if not isinstance(error, HttpProcessingError) or error.code != 400:
        return True
    reason = str(error.message).strip().split("\n", 1)[0].rstrip(":")
    client = record.args[0] if isinstance(record.args, tuple) and record.args else "a client"
    record.msg, record.args = "malformed HTTP request from %s answered 400: %s", (client, reason)
    record.levelno, record.levelname = logging.INFO, "INFO"
    record.exc_info = record.exc_text = None
    return logging.getLogger(record.name).isEnabledFor(logging.INFO)


class LineFormatter(logging.Formatter):
    """logging's own `%(asctime)s`, its date and time formatted once a second: formatting them took 6.4 of the
    35 us a log line cost at max req/s (timed inside a serving Velo). `FORMAT` itself is written directly."""

    def format(self, record: logging.LogRecord) -> str:
        """`FORMAT`'s line, for a record without a traceback: logging's `%`-style fills it from the record's whole
        dict, 25 of the 61 thousand instructions a line cost (callgrind); any other record or format as logging does."""
        if self._fmt != FORMAT or record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        return f"{record.asctime} {record.levelname} {record.name}: {record.message}"

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self.default_msec_format % (_local_time(int(record.created), self.default_time_format), record.msecs)


class AccessLog(AbstractAccessLogger):
    """aiohttp's default access line (`%a %t "%r" %s %b "%{Referer}i" "%{User-Agent}i"`), byte for byte: the
    client's address, when the request started (local time), its request line, the status, the body's bytes."""

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: BaseRequest, response: StreamResponse, time_taken: float) -> None:
        headers, version = request.headers, request.version
        self.logger.info('%s %s "%s %s HTTP/%d.%d" %d %d "%s" "%s"', request.remote or "-",
                         self._started(time.time() - time_taken), request.method, request.path_qs, version.major,
                         version.minor, response.status, response.body_length, headers.get("Referer", "-"),
                         headers.get("User-Agent", "-"))

    @staticmethod
    def _started(at: float) -> str:
        return _local_time(int(at), _CLF_TIME)


@functools.lru_cache(maxsize=4)  # a second's stamp in each of the two forms, and the second before
def _local_time(second: int, form: str) -> str:
    """`second` in local time, in `form`: formatted once a second, not once a line."""
    return time.strftime(form, time.localtime(second))
