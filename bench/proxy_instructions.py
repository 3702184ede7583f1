"""The instructions Velo's own process runs for a request (valgrind's callgrind), over the zero-work fake upstream:
a count, not a time, so it does not move with the machine's load. On these 2 shared cores an A/B of one tree against
itself read +8.6% in CPU time, where repeated counts of one tree agree within ~1%. The count is of user-space work
only (not the kernel's socket reads and writes), so it moves less than bench/proxy_overhead.py's CPU figure.

Each tree (this checkout, then each `--against` commit) runs `velo serve` under callgrind with its response cache
off, and answers 100 requests to warm up, then `--requests` more, one at a time (or from `--clients` at once, so that
they queue for the backend's 4 slots), counted: the same short OpenAI chat request (or streamed, with `--stream`).
Reported as thousand instructions a request, and as ratios against the first `--against` tree. `--asked` counts
this checkout once more with `always_stream = false`: a one-answer request then asks its backend for one answer, not
a stream to fold (issue 20's price, where the backend sends a token a write).

    python bench/proxy_instructions.py [--against 742e6b3 ...] [--requests 400] [--stream] [--asked] [--clients 32]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proxy_overhead import AUTH, MSG, _checkout, _run_fake, _spawn  # noqa: E402
from tests.velo_serve import ROOT, velo_process  # noqa: E402

WARM_UP = 100


def instructions(root: str, upstream: str, body: dict, requests: int, always_stream: bool = True,
                 clients: int = 1) -> float:
    """Instructions a request in the Velo of the tree at `root`, averaged over `requests` sent by `clients`."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        config = f'[[backends]]\nname = "up"\nkind = "openai"\nurls = ["{upstream}"]\n'
        config += "" if always_stream else "always_stream = false\n"  # a key trees before issue 20 do not know
        config += "[cache]\nenabled = false\n"
        under = ("valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}")
        with velo_process(Path(folder), config, ready_within=600, root=root, under=under) as (url, proc):
            asyncio.run(_send(url, body, WARM_UP, clients))
            _control(proc.pid, "-i", "on")
            asyncio.run(_send(url, body, requests, clients))
            _control(proc.pid, "-i", "off")
            _control(proc.pid, "-d")  # the counts so far, to out.1
        return max(_total(dump) for dump in Path(folder).glob("callgrind.out*")) / requests


async def _send(url: str, body: dict, n: int, clients: int) -> None:
    """`n` requests, each of `clients` sending the next as soon as its last is answered."""
    left = iter(range(n))

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in left:
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
    async with aiohttp.ClientSession(headers=AUTH, connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _total(dump: Path) -> int:
    """A dump's instruction count, its `totals:` line (its `summary:` line reads 0 for a dump asked for with
    callgrind_control; the dump at the exit, with instrumentation off, counts 0)."""
    return max((int(line.split()[1]) for line in dump.read_text().splitlines() if line.startswith("totals:")),
               default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", nargs="*", default=["742e6b3"], help="commits to count as well (the first: the "
                    "baseline of the ratios)")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--stream", action="store_true", help="a streamed answer (the fake's 256 words) instead")
    ap.add_argument("--asked", action="store_true", help="this checkout with always_stream = false as well")
    ap.add_argument("--clients", type=int, default=1, help="clients sending at once (more than 4 queue)")
    args = ap.parse_args()
    if shutil.which("callgrind_control") is None:
        sys.exit("proxy_instructions: needs valgrind (Debian: apt-get install valgrind), which Velo itself does not")
    os.environ.setdefault("PYTHONHASHSEED", "0")  # every Velo alike: the seed alone moves a count by up to 1%
    body = {"model": "fake", "messages": MSG, **({"stream": True} if args.stream else {"max_tokens": 8})}
    urls = multiprocessing.get_context("spawn").Queue()
    fake = _spawn(_run_fake, urls, 256)
    try:
        upstream = urls.get(timeout=60)
        with ExitStack() as stack:
            trees = {ref: _checkout(stack, ref) for ref in args.against} | {"this checkout": ROOT}
            counts = {ref: instructions(root, upstream, body, args.requests, clients=args.clients)
                      for ref, root in trees.items()}
            if args.asked:
                counts["asked"] = instructions(ROOT, upstream, body, args.requests, False, args.clients)
    finally:
        fake.terminate()
    base = counts[args.against[0]] if args.against else None
    for ref, count in counts.items():
        ratio = f" ({count / base:.2f}x {args.against[0]})" if base else ""
        print(f"instructions  {ref:>14}  {count / 1000:8.1f} thousand a request{ratio}")


if __name__ == "__main__":
    main()
