"""What Velo costs on the request path: the same OpenAI-dialect requests sent straight to an upstream and through
Velo, in the same run, reported as ratios against the direct baseline; against the fast upstream also through
LiteLLM's proxy (`litellm[proxy]`, installed apart by scripts/install-litellm.sh: its pins would fight Velo's),
as the peer. Figures: latency p50/p99 of short requests, streamed pieces/s, and max req/s of one process; and
each of Velo's four dialects (Ollama, OpenAI chat, Anthropic Messages, OpenAI Responses) asking the same
question of the same upstream, against the OpenAI dialect (goal: within 10%); against llama-server also its own
`/infill` as llama.vscode sends it, which Velo passes on as is.

Two upstreams: a fast fake (tests/fakes.py FakeOpenAI, no delay: Velo's CPU is most of a request's) and the real
llama-server with SmolLM2-135M (tests/llama_server.py: what a user feels). Upstream, Velo and this client each run
in their own process; direct and proxied requests alternate so machine noise hits both alike. Velo's response
cache is off (it would answer from memory, which measures the cache, not the path). Against the fake, a third side,
`streamed`, asks the upstream for what Velo asks of it for a short request (a stream, read whole): Velo minus it
is Velo's own cost; `streamed` minus direct is the upstream's extra work for the stream. A fourth, `asked`, is a
second Velo with `always_stream = false`, which sends one-answer requests as asked (no stream, so no early find of
a hung backend): the path as it costs without that trade. With `--against REF`, a fifth is Velo from the tree of
commit REF (the same command over the same upstream), so a change's figures come with the tree before it in the same
run. Every Velo runs as `velo serve` runs it, its INFO logging on.

    python bench/proxy_overhead.py [--requests 200] [--stream-words 256] [--skip-llama] [--dialect-requests 300]
                                   [--rps-clients 32] [--rps-seconds 5] [--rps-rounds 3] [--against REF]
                                   [--litellm PATH]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.http_ready import wait_until_ok  # noqa: E402
from tests.llama_server import chat_server, free_port  # noqa: E402
from tests.velo_serve import ROOT, velo_process  # noqa: E402

MSG = [{"role": "user", "content": "Say hello"}]
LITELLM = Path(__file__).resolve().parent.parent / ".build" / "litellm" / "bin" / "litellm"
MASTER_KEY = "sk-velo-bench"  # LiteLLM refuses to start without one; the other sides ignore the header
AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


def _run_fake(urls: multiprocessing.Queue, words: int) -> None:
    from tests.fakes import FakeOpenAI

    async def run() -> None:
        async with FakeOpenAI(models=["fake"]) as fake:
            fake.script.reply = " ".join(["word"] * words)
            urls.put(fake.url)
            await asyncio.Event().wait()
    asyncio.run(run())


def _velo(stack: ExitStack, kind: str, upstream: str, always_stream: bool = True, models: tuple[str, ...] = (),
          root: str = ROOT) -> tuple[str, int]:
    """`velo serve` as a user runs it (its INFO logs included: 164 us of a request's ~870 before log_setup.py), from
    the checkout at `root`, with its response cache off; its URL and pid. `models`: the names a llama-server is
    listed under, which are the names Velo serves it by."""
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    config = f'[[backends]]\nname = "up"\nkind = "{kind}"\nurls = ["{upstream}"]\n'
    config += "" if always_stream else "always_stream = false\n"  # a key trees before issue 20 do not know
    config += f"models = {json.dumps(list(models))}\n" if models else ""
    url, proc = stack.enter_context(velo_process(folder, config + "[cache]\nenabled = false\n", root=root))
    return url, proc.pid


def _checkout(stack: ExitStack, ref: str) -> str:
    """The tree of commit `ref` of this repository, in a folder of its own."""
    folder = stack.enter_context(tempfile.TemporaryDirectory())
    tree = subprocess.run(["git", "-C", ROOT, "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=tree, check=True)
    return folder


def _spawn(target, *args) -> multiprocessing.Process:
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


async def _once(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, int]:
    """Seconds for one request, and the content pieces it streamed (1 when not streamed).

    llama-server closes connections idle for 5 s; a request that met such a stale one is timed again afresh."""
    try:
        return await _timed(session, url, body)
    except aiohttp.ServerDisconnectedError:
        return await _timed(session, url, body)


async def _timed(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, int]:
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        if not body.get("stream"):
            await resp.read()
            return time.perf_counter() - started, 1
        pieces = 0
        async for line in resp.content:
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                pieces += 1
    return time.perf_counter() - started, pieces


Sides = dict[str, str]  # side name -> base URL; "direct" is the baseline
# The upstream asked what Velo asks of it for a one-answer request: a stream (so a backend that hangs is found after
# first_token_timeout, adapters/http.py), read whole. Against it, Velo's own cost; against "direct", what the
# client feels, the upstream's extra work for the stream included.
STREAMED = "streamed"
ASKED = "asked"  # Velo with `always_stream = false`
AGAINST = "against"  # Velo from the tree of --against


def as_sent(side: str, body: dict) -> dict:
    if side != STREAMED or body.get("stream"):
        return body
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


async def latency(session: aiohttp.ClientSession, sides: Sides, body: dict, n: int) -> dict[str, list[float]]:
    """Seconds per sequential request, per side; the sides take turns, in a rotating order."""
    out: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for i in range(n):
        for name in names[i % len(names):] + names[:i % len(names)]:
            out[name].append((await _once(session, sides[name], as_sent(name, body)))[0])
    return out


async def throughput(session: aiohttp.ClientSession, sides: Sides, body: dict, rounds: int,
                     concurrent: int) -> dict[str, list[float]]:
    """Streamed content pieces per second, `concurrent` streams at once, for each round."""
    sides = {name: url for name, url in sides.items() if name not in (STREAMED, ASKED)}  # streams as direct, velo
    out: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:  # no side always runs on a warmer machine
            started = time.perf_counter()
            results = await asyncio.gather(*(_once(session, sides[name], body) for _ in range(concurrent)))
            out[name].append(sum(p for _, p in results) / (time.perf_counter() - started))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Pids = dict[str, int]  # process name -> pid, for CPU per request: on 2 shared cores, req/s also counts the others'


async def max_rps(session: aiohttp.ClientSession, url: str, body: dict, clients: int, seconds: float,
                  pids: Pids) -> tuple[float, dict[str, float]]:
    """Completed non-streamed requests per second with `clients` always waiting on one, and the CPU microseconds
    each process in `pids` spent per request meanwhile."""
    deadline, done = time.perf_counter() + seconds, 0
    cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await _once(session, url, body)
            done += 1
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    rate = done / (time.perf_counter() - started)
    return rate, {name: (cpu_seconds(pid) - cpu[name]) / done * 1e6 for name, pid in pids.items()}


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def report(name: str, lat: dict[str, list[float]], tput: dict[str, list[float]], unit: str,
           rps: dict[str, float], cpu: dict[str, dict[str, float]]) -> None:
    """Each proxy against direct: latency p50/p99, stream rate, max req/s, CPU per request of each process."""
    for q in (50, 99):
        d = pct(lat["direct"], q) * 1e3
        print(f"{name:14} latency p{q}  direct {d:8.2f} ms" + "".join(
            f"   {side} {pct(v, q) * 1e3:8.2f} ms ({pct(v, q) * 1e3 / d:.2f}x, {pct(v, q) * 1e3 - d:+.2f} ms)"
            for side, v in lat.items() if side != "direct"))
    d = statistics.median(tput["direct"])
    print(f"{name:14} stream median direct {d:8.1f} {unit}" + "".join(
        f"   {side} {statistics.median(v):8.1f} ({statistics.median(v) / d:.2f}x)"
        for side, v in tput.items() if side != "direct"))
    if rps:
        print(f"{name:14} max req/s     direct {rps['direct']:8.1f}" + "".join(
            f"   {side} {v:8.1f} ({v / rps['direct']:.2f}x)" for side, v in rps.items() if side != "direct"))
    if any(cpu.values()):
        print(f"{name:14} CPU us per request at max req/s:" + ";".join(
            f" {side}: " + ", ".join(f"{proc} {us:.0f}" for proc, us in used.items()) for side, used in cpu.items()))
    if AGAINST in lat:
        then, v = lat[AGAINST], lat["velo"]
        print(f"{name:14} velo against the --against tree: latency p50 {pct(v, 50) / pct(then, 50):.2f}x, "
              f"p99 {pct(v, 99) / pct(then, 99):.2f}x" + (f", max req/s {rps['velo'] / rps[AGAINST]:.2f}x, CPU a "
                                                         f"request {cpu['velo']['velo'] / cpu[AGAINST][AGAINST]:.2f}x"
                                                         if rps else ""))
    if STREAMED in lat:
        up, v = lat[STREAMED], lat["velo"]
        print(f"{name:14} velo over the streamed upstream: latency p50 {(pct(v, 50) - pct(up, 50)) * 1e3:+.2f} ms, "
              f"p99 {(pct(v, 99) - pct(up, 99)) * 1e3:+.2f} ms" +
              (f", max req/s {rps['velo'] / rps[STREAMED]:.2f}x" if rps else ""))


async def bench_sides(name: str, sides: Sides, requests: int, short: dict, long: dict, rounds: int,
                      concurrent: int, unit: str, rps_clients: int = 0, rps_seconds: float = 0,
                      pids: Pids | None = None, rps_rounds: int = 1) -> None:
    for url in sides.values():
        await wait_until_ok(url + "/v1/models", 60, AUTH)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=AUTH) as session:
        await latency(session, sides, short, 5)  # warm connections and caches
        lat = await latency(session, sides, short, requests)
        tput = await throughput(session, sides, long, rounds, concurrent)
        # the upstream's CPU on every side, Velo's on its own; the sides take turns, in a rotating order
        measured: dict[str, list[tuple[float, dict[str, float]]]] = {side: [] for side in sides}
        names = list(sides)
        for i in range(rps_rounds if rps_clients else 0):
            for side in names[i % len(names):] + names[:i % len(names)]:
                measured[side].append(await max_rps(session, sides[side], as_sent(side, short), rps_clients,
                                                    rps_seconds, {p: pid for p, pid in (pids or {}).items()
                                                                  if p in ("upstream", side)}))
    print(f"{name:14} {requests} sequential requests, {rounds} rounds of {concurrent} concurrent streams"
          + (f", max req/s with {rps_clients} clients for {rps_seconds:g} s, median of {rps_rounds} rounds"
             if rps_clients else ""))
    report(name, lat, tput, unit, {side: statistics.median(r for r, _ in m) for side, m in measured.items() if m},
           {side: {proc: statistics.median(used[proc] for _, used in m) for proc in m[0][1]}
            for side, m in measured.items() if m})


# The same question in each dialect: (path, short non-streamed body, long streamed body).
DIALECTS = {
    "openai": ("/v1/chat/completions", {"model": "fake", "messages": MSG, "max_tokens": 8},
               {"model": "fake", "messages": MSG, "stream": True}),
    "ollama": ("/api/chat", {"model": "fake", "messages": MSG, "stream": False, "options": {"num_predict": 8}},
               {"model": "fake", "messages": MSG}),
    "anthropic": ("/v1/messages", {"model": "fake", "messages": MSG, "max_tokens": 8},
                  {"model": "fake", "messages": MSG, "max_tokens": 4096, "stream": True}),
    "responses": ("/v1/responses", {"model": "fake", "input": "Say hello", "max_output_tokens": 8, "store": False},
                  {"model": "fake", "input": "Say hello", "stream": True, "store": False}),
}


async def dialect_latency(session: aiohttp.ClientSession, velo: str, n: int, streamed: bool) -> dict[str, list[float]]:
    """Seconds per sequential request through each dialect, taking turns in a rotating order."""
    out: dict[str, list[float]] = {name: [] for name in DIALECTS}
    names = list(DIALECTS)
    for i in range(n):
        for name in names[i % len(names):] + names[:i % len(names)]:
            path, short, long = DIALECTS[name]
            started = time.perf_counter()
            async with session.post(velo + path, json=long if streamed else short) as resp:
                assert resp.status == 200, (path, await resp.text())
                await resp.read()
            out[name].append(time.perf_counter() - started)
    return out


async def bench_dialects(velo: str, direct: str, n: int) -> None:
    """Each dialect against the OpenAI dialect, through the same Velo to the same upstream; the direct call to the
    upstream (same short question) shows what Velo itself adds."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=AUTH) as session:
        await dialect_latency(session, velo, 5, False)
        base = (await latency(session, {"direct": direct}, DIALECTS["openai"][1], n))["direct"]
        short = await dialect_latency(session, velo, n, False)
        streamed = await dialect_latency(session, velo, max(n // 10, 10), True)
    print(f"dialects       {n} sequential short requests each, {max(n // 10, 10)} streamed answers each, one Velo")
    for q in (50, 99):
        ref, d = pct(short["openai"], q), pct(base, q)
        print(f"dialects       latency p{q}  openai {ref * 1e3:6.2f} ms (+{(ref - d) * 1e3:.2f} over direct)" + "".join(
            f"   {name} {pct(v, q) * 1e3:6.2f} ms ({pct(v, q) / ref:.2f}x)" for name, v in short.items()
            if name != "openai"))
    ref = statistics.median(streamed["openai"])
    print(f"dialects       stream median openai {ref * 1e3:6.1f} ms" + "".join(
        f"   {name} {statistics.median(v) * 1e3:6.1f} ms ({statistics.median(v) / ref:.2f}x)"
        for name, v in streamed.items() if name != "openai"))


def _start_litellm(binary: str, upstream: str, model: str) -> tuple[subprocess.Popen, str]:
    """LiteLLM's proxy in front of the same upstream, one worker, no database, its own logging quiet."""
    port, folder = free_port(), Path(tempfile.mkdtemp())
    (folder / "config.yaml").write_text(
        f"model_list:\n  - model_name: {model}\n    litellm_params:\n      model: openai/{model}\n"
        f"      api_base: {upstream}/v1\n      api_key: none\n")
    env = os.environ | {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "LITELLM_MASTER_KEY": MASTER_KEY}
    proc = subprocess.Popen([binary, "--config", str(folder / "config.yaml"), "--host", "127.0.0.1",
                             "--port", str(port), "--num_workers", "1"], env=env, cwd=folder,
                            stdout=subprocess.DEVNULL, stderr=open(folder / "litellm.log", "w"))
    return proc, f"http://127.0.0.1:{port}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200, help="sequential requests per side (fake upstream)")
    ap.add_argument("--stream-words", type=int, default=256, help="pieces per streamed answer (fake upstream)")
    ap.add_argument("--llama-requests", type=int, default=20)
    ap.add_argument("--llama-tokens", type=int, default=64)
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--dialect-requests", type=int, default=300, help="sequential requests per dialect")
    ap.add_argument("--rps-clients", type=int, default=32)
    ap.add_argument("--rps-seconds", type=float, default=5)
    ap.add_argument("--rps-rounds", type=int, default=3, help="max req/s rounds per side, reported as the median")
    ap.add_argument("--against", metavar="REF", help="also a Velo from this commit's tree (the same `velo serve`), "
                    "e.g. 742e6b3, the tree before issue 15")
    ap.add_argument("--litellm", default=str(LITELLM), help="LiteLLM proxy binary (scripts/install-litellm.sh); "
                    "skipped when missing")
    args = ap.parse_args()

    urls = multiprocessing.get_context("spawn").Queue()
    fake_proc = _spawn(_run_fake, urls, args.stream_words)
    fake = urls.get(timeout=60)
    short = {"model": "fake", "messages": MSG, "max_tokens": 8}
    long = {"model": "fake", "messages": MSG, "stream": True}
    with ExitStack() as stack:
        stack.callback(fake_proc.terminate)
        (velo, pid), (asked, asked_pid) = _velo(stack, "openai", fake), _velo(stack, "openai", fake, False)
        sides = {"direct": fake, STREAMED: fake, "velo": velo, ASKED: asked}
        pids = {"upstream": fake_proc.pid, "velo": pid, ASKED: asked_pid}
        if args.against:
            sides[AGAINST], pids[AGAINST] = _velo(stack, "openai", fake, root=_checkout(stack, args.against))
        if Path(args.litellm).exists():
            litellm, sides["litellm"] = _start_litellm(args.litellm, fake, "fake")
            stack.callback(litellm.terminate)
        else:
            print(f"no LiteLLM at {args.litellm}: run scripts/install-litellm.sh for the peer figures")
        asyncio.run(bench_sides("fake upstream", sides, args.requests, short, long, 5, 4, "pieces/s",
                                args.rps_clients, args.rps_seconds, pids, args.rps_rounds))
        asyncio.run(bench_dialects(velo, fake, args.dialect_requests))
    if args.skip_llama:
        return

    llama = chat_server(Path(tempfile.mkdtemp())).start()
    short = {"model": "m", "messages": MSG, "max_tokens": 8, "temperature": 0}
    long = {"model": "m", "messages": STORY, "max_tokens": args.llama_tokens, "temperature": 0, "stream": True}
    with ExitStack() as stack:
        stack.callback(llama.stop)
        velo, _ = _velo(stack, "llamacpp", llama.url, models=("m",))
        asyncio.run(bench_sides("llama-server", {"direct": llama.url, "velo": velo}, args.llama_requests, short, long,
                                6, 1, "tok/s"))
        asyncio.run(bench_infill(llama.url, velo, args.llama_requests))


# llama.vscode's autocomplete request (src/llama-server.ts): llama-server's own /infill, which Velo passes on as is
INFILL = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "prompt": "", "n_predict": 8,
          "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
          "top_k": 40, "top_p": 0.99, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True}


async def bench_infill(direct: str, velo: str, n: int) -> None:
    """/infill latency straight to llama-server and through Velo's pass-through, the sides taking turns."""
    out: dict[str, list[float]] = {"direct": [], "velo": []}
    async with aiohttp.ClientSession() as session:
        for i in range(2 * n):
            side = ("direct", "velo")[i % 2]
            started = time.perf_counter()
            async with session.post((direct, velo)[i % 2] + "/infill", json=INFILL) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            out[side].append(time.perf_counter() - started)
    for q in (50, 99):
        d, v = pct(out["direct"], q) * 1e3, pct(out["velo"], q) * 1e3
        print(f"{'/infill':14} latency p{q}  direct {d:8.2f} ms   velo {v:8.2f} ms ({v / d:.2f}x, {v - d:+.2f} ms)")


if __name__ == "__main__":
    main()
