"""`ollama create` from a GGUF through Velo: the file's upload to /api/blobs goes on to the Ollama backend as it
arrives (proxy/routes_ollama.py `blob`), never held by Velo. Figures: the upload's MB/s through Velo against the
same upload sent straight to the backend, in the same run (taking turns), and Velo's peak memory (VmHWM) before and
after, against the upload's size.

The backend is the Ollama protocol double (tests/fakes.py, which follows server/routes.go's CreateBlobHandler: it
checks the body's sha256 against the digest), in this process; Velo runs as `velo serve` in its own. Each upload is
a new blob (a held one is answered 200 at once, unread).

    python bench/blob_upload.py [--mb 256] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes import OllamaDouble  # noqa: E402
from tests.velo_serve import velo_process  # noqa: E402

PIECE = 1024 * 1024


def peak_mb(pid: int) -> float:
    """A process's peak resident memory (Linux /proc VmHWM), in MB."""
    line = next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


async def upload(session: aiohttp.ClientSession, url: str, mb: int) -> float:
    """Seconds to upload `mb` MB of new random data to `url`'s /api/blobs, answered 201."""
    data = os.urandom(16) + os.urandom(PIECE) * mb  # a new digest each call, without a GB of randomness
    digest = "sha256:" + hashlib.sha256(data).hexdigest()

    async def pieces():
        for i in range(0, len(data), PIECE):
            yield data[i:i + PIECE]
    started = time.perf_counter()
    async with session.post(f"{url}/api/blobs/{digest}", data=pieces(),
                            headers={"Content-Length": str(len(data))}) as resp:
        assert resp.status == 201, await resp.text()
    return time.perf_counter() - started


async def main(mb: int, rounds: int) -> None:
    double = OllamaDouble()
    double.max_body = (mb + 1) * PIECE
    async with double:
        with tempfile.TemporaryDirectory() as folder:
            config = f'[[backends]]\nname = "o"\nkind = "ollama"\nurls = ["{double.url}"]\n[cache]\nenabled = false\n'
            loop = asyncio.get_running_loop()
            serving = velo_process(Path(folder), config)
            velo, proc = await loop.run_in_executor(None, serving.__enter__)
            try:
                before = peak_mb(proc.pid)
                times: dict[str, list[float]] = {"direct": [], "velo": []}
                async with aiohttp.ClientSession() as session:
                    for i in range(rounds):
                        sides = [("direct", double.url), ("velo", velo)]
                        for name, url in sides if i % 2 == 0 else sides[::-1]:
                            times[name].append(await upload(session, url, mb))
                            double.blobs.clear()
                after = peak_mb(proc.pid)
            finally:
                await loop.run_in_executor(None, serving.__exit__, None, None, None)
    direct, through = statistics.median(times["direct"]), statistics.median(times["velo"])
    print(f"upload {mb} MB, median of {rounds}: direct {mb / direct:7.1f} MB/s   velo {mb / through:7.1f} MB/s "
          f"({direct / through:.2f}x)")
    print(f"velo peak memory: {before:.0f} MB before, {after:.0f} MB after {rounds} uploads of {mb} MB "
          f"(+{after - before:.0f} MB, {(after - before) / mb:.3f}x one upload)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(main(args.mb, args.rounds))
