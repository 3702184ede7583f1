"""Velo's access line is aiohttp's default one, byte for byte, and is skipped where INFO is off."""
from __future__ import annotations

import asyncio
import datetime
import logging
import sys
import time

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from aiohttp.web_log import AccessLogger

from proxy.log_setup import FORMAT, AccessLog, LineFormatter, malformed_http


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _without_time(line: str) -> str:
    return line.split("[", 1)[0] + line.split("]", 1)[1]


def test_the_access_line_is_aiohttps_default_line():
    logger, kept = logging.getLogger("test.access"), Kept()
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    for headers in ({"User-Agent": "OpenAI/Python 1.99", "Referer": "http://localhost:3000/"}, {}):
        request = make_mocked_request("POST", "/v1/chat/completions?x=1&y=%20", headers=headers)
        response = web.Response(body=b'{"ok": true}', status=201)
        AccessLogger(logger, AccessLogger.LOG_FORMAT).log(request, response, 0.25)
        AccessLog(logger, AccessLogger.LOG_FORMAT).log(request, response, 0.25)
        theirs, ours = kept.lines[-2:]
        assert _without_time(ours) == _without_time(theirs)
        assert '"POST /v1/chat/completions?x=1&y=%20 HTTP/1.1" 201 ' in ours
    assert ours.count('"-"') == 2  # no Referer, no User-Agent


def test_the_time_is_when_the_request_started_in_aiohttps_form():
    at = time.time() - 3600.5
    local = datetime.datetime.fromtimestamp(int(at)).astimezone()
    assert AccessLog._started(at) == local.strftime("[%d/%b/%Y:%H:%M:%S %z]")
    assert AccessLog._started(at + 1) != AccessLog._started(at)  # formatted again for another second


def test_it_is_off_below_info():
    logger = logging.getLogger("test.access.quiet")
    logger.setLevel(logging.WARNING)
    assert not AccessLog(logger, "").enabled
    logger.setLevel(logging.INFO)
    assert AccessLog(logger, "").enabled


def test_the_time_of_a_line_is_loggings_own():
    ours, theirs = LineFormatter(FORMAT), logging.Formatter(FORMAT)
    for created in (1_700_000_000.001, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.25):  # a second, back again
        record = logging.LogRecord("velo.requests", logging.INFO, "", 0, "done after %.3fs", (0.5,), None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert ours.format(record) == theirs.format(record)


def test_a_line_is_loggings_own_with_a_traceback_or_without():
    ours, theirs = LineFormatter(FORMAT), logging.Formatter(FORMAT)
    try:
        raise ValueError("boom")
    except ValueError:
        failed = sys.exc_info()
    for level, args, exc_info in ((logging.WARNING, ("x", 2), None), (logging.ERROR, ("x", 2), failed)):
        record = logging.LogRecord("velo", level, "", 0, "%s failed %d times", args, exc_info)
        assert ours.format(record) == theirs.format(record)


async def test_a_clients_malformed_http_is_one_info_line_without_its_bytes(aiohttp_server, caplog):
    """aiohttp logged each at ERROR with a traceback and the offending bytes (a header line may carry a key)."""
    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a real server error")

    app = web.Application()
    app.router.add_get("/broken", broken)
    server = await aiohttp_server(app)
    logging.getLogger("aiohttp.server").addFilter(malformed_http)
    try:
        with caplog.at_level(logging.INFO, logger="aiohttp.server"):
            for raw in (b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization sk-secret\r\n\r\n",
                        b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n"):
                reader, writer = await asyncio.open_connection(server.host, server.port)
                writer.write(raw)
                assert (await reader.readline()).split()[1] in (b"400", b"500")
                writer.close()
                await writer.wait_closed()
    finally:
        logging.getLogger("aiohttp.server").removeFilter(malformed_http)
    malformed, failed = caplog.records
    assert (malformed.levelno, malformed.exc_info) == (logging.INFO, None)
    assert malformed.getMessage() == "malformed HTTP request from 127.0.0.1 answered 400: Invalid header token"
    assert "sk-secret" not in caplog.text
    assert failed.levelno == logging.ERROR and failed.exc_info[0] is RuntimeError  # a server's own error stays one
