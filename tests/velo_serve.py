"""`velo serve` in its own process, as a user runs it, for the tests that need the real command line."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.http_ready import wait_until_ok
from tests.llama_server import free_port

ROOT = str(Path(__file__).resolve().parents[1])


@contextmanager
def velo_serve(folder: Path, config: str, ready_within: float = 180) -> Iterator[str]:
    """Runs this checkout's `velo serve` on `config` (TOML after the [server] port, which is chosen here) in
    `folder`, and yields its URL once /api/tags answers; its output goes to folder/velo.log (a file, not a pipe:
    a full pipe would stall the server), and its presets to folder/velo/presets.json."""
    with velo_process(folder, config, ready_within) as (url, _):
        yield url


@contextmanager
def velo_process(folder: Path, config: str, ready_within: float = 180, root: str = ROOT,
                 under: tuple[str, ...] = ()) -> Iterator[tuple[str, subprocess.Popen]]:
    """`velo_serve`, from the checkout at `root` (another commit's tree, for a benchmark), yielding its process too;
    `under`: a command it runs under (valgrind, for bench/proxy_instructions.py)."""
    port = free_port()
    (folder / "config.toml").write_text(f"[server]\nport = {port}\n{config}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "XDG_DATA_HOME": str(folder)}  # its own preset store, not the machine's
    with open(folder / "velo.log", "wb") as log:
        command = [*under, sys.executable, "-m", "proxy", "serve", "--config", str(folder / "config.toml")]
        proc = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(wait_until_ok(url + "/api/tags", ready_within, proc=proc))
            yield url, proc
        finally:
            proc.terminate()
            proc.wait(30)
