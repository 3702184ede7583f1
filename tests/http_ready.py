"""Waiting for a server started in another process to answer, for tests and bench scripts alike."""
from __future__ import annotations

import asyncio
import subprocess
import time

import aiohttp


async def wait_until_ok(url: str, timeout: float, headers: dict[str, str] | None = None,
                        proc: subprocess.Popen | None = None) -> None:
    """Poll GET url until it answers 200 (TimeoutError after `timeout` s). With proc, a server process that
    exits first fails at once, with its output. Its own session: a connection idle while a server starts
    goes stale, so none is kept for later requests."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(headers=headers) as session:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{proc.args} exited with {proc.returncode}: "
                                   f"{proc.stdout.read() if proc.stdout else ''}")
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 200 within {timeout:g} s")
