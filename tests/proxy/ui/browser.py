"""Debian's chromium driven by Playwright's Python driver, for tests of pages Velo serves. Never `playwright
install` (no downloads here): scripts/install --test installs the `chromium` package, and Playwright launches it."""
from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

from playwright.async_api import Browser, async_playwright

CHROMIUM = os.environ.get("VELO_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTEFACTS = Path(__file__).resolve().parents[3] / "bench" / "out"  # gitignored


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} not found: scripts/install --test installs Debian's chromium"
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            await browser.close()
