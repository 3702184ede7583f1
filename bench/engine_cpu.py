"""Velo's engine vs llama-server vs transformers generate(), on the same GGUF, prompts and output lengths.

    python bench/engine_cpu.py [--max-tokens 32] [--concurrency 1,8] [--threads 2] [--dtype bfloat16]
                               [--reps 3] [--skip-llama] [--skip-hf] [--background-load N] [--kv-dtype int8]
                               [--compile]

Every system runs the same chat prompts (rendered once, sent as token ids) with greedy decoding and
`ignore_eos`, so each request produces exactly --max-tokens tokens. Per concurrency level c, c requests
start together: tok/s is generated tokens / wall time, TTFT the mean time to each request's first token
(transformers: a batch of c through generate(); its TTFT is a max_new_tokens=1 run). Velo and llama-server
run --reps times, interleaved, and report medians; transformers, the slow baseline, runs once after them.

Roofline: the run measures the machine's memory bandwidth (a large copy, engine/roofline.py) and prints each
system's decode rate at one stream times the bytes of weights a decode step reads, as a fraction of it.
`--background-load N` keeps N busy processes (each one core, bounded in time) running beside both systems for
the whole run, as an IDE and a browser would on a user's machine.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from engine import EngineConfig, LLMEngine, SamplingParams, default_model_path  # noqa: E402
from engine.roofline import decode_bytes, gguf_decode_bytes, memory_bandwidth  # noqa: E402
from tests.llama_server import free_port  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion briefly.",
             "List three prime numbers.", "Why is the sky blue?", "Give me a tip for learning Python.",
             "What does a CPU do?", "Describe a cat in one sentence."]
LLAMA_SERVER = os.environ.get("VELO_LLAMA_SERVER", os.path.join(os.path.dirname(__file__), "..", ".build",
                                                                "llama.cpp-build", "bin", "llama-server"))


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    """n chat prompts as token ids: QUESTIONS rendered with the model's template, repeated as needed."""
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]
    return (prompts * (n // len(prompts) + 1))[:n]


@dataclass
class Result:
    system: str
    concurrency: int
    tokens: int
    wall_s: float
    ttft_s: float

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def decode_tok_s(self) -> float:
        """Tokens per second after the first token: the decode steps alone (per stream at concurrency 1)."""
        return (self.tokens - self.concurrency) / (self.wall_s - self.ttft_s)


@contextlib.contextmanager
def background_load(n: int, seconds: float) -> Iterator[None]:
    """n busy processes, one core each, that end by themselves after `seconds` if nothing stops them."""
    loop = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def print_roofline(results: list[Result], bandwidth: float, bytes_per_token: dict[str, int]) -> None:
    print(f"roofline: memory bandwidth {bandwidth:.1f} GB/s (a 512 MiB copy, bytes read + written)")
    for r in results:
        if r.concurrency == 1 and r.system in bytes_per_token:
            achieved = r.decode_tok_s * bytes_per_token[r.system] / 1e9
            print(f"  {r.system:13s} decode {r.decode_tok_s:6.1f} tok/s x {bytes_per_token[r.system] / 1e6:6.1f} MB "
                  f"of weights a token = {achieved:5.1f} GB/s, {achieved / bandwidth:.2f} of the bandwidth")


def run_velo(engine: LLMEngine, prompts: list[list[int]], max_tokens: int,
             params: SamplingParams | None = None) -> tuple[int, float, float]:
    """(tokens, wall seconds, mean TTFT) for all prompts started together; greedy unless `params` says otherwise."""
    params = params or SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    done: queue.Queue = queue.Queue()
    first: dict[int, float] = {}
    counts: dict[int, int] = {}
    start = time.perf_counter()

    def sink(i):
        def on_output(out):
            if isinstance(out, BaseException):
                done.put(out)
                return
            first.setdefault(i, time.perf_counter())
            counts[i] = counts.get(i, 0) + len(out.token_ids)
            if out.finished:
                done.put(i)
        return on_output
    for i, p in enumerate(prompts):
        engine.add_request(p, params, sink(i))
    for _ in prompts:
        if isinstance(item := done.get(), BaseException):
            raise item
    wall = time.perf_counter() - start
    return sum(counts.values()), wall, sum(t - start for t in first.values()) / len(prompts)


def engine_levels(model: str, threads: int, levels: list[int], max_tokens: int, **config) -> dict[int, tuple]:
    """run_velo at each concurrency level on one freshly loaded engine (prefix cache off; `config`: the EngineConfig
    fields a bench compares), after a short warm-up."""
    engine = LLMEngine.from_pretrained(model, EngineConfig(num_threads=threads, progress=False,
                                                           enable_prefix_cache=False, **config))
    try:
        prompts = chat_prompts(engine.tokenizer, max(levels))
        run_velo(engine, prompts[:1], 4)  # warm-up
        return {c: run_velo(engine, prompts[:c], max_tokens) for c in levels}
    finally:
        engine.shutdown()


def compare_configs(model: str, threads: int, levels: list[int], max_tokens: int, reps: int,
                    variants: dict[str, dict]) -> None:
    """Two EngineConfig variants (name -> fields), the first against the second: tok/s and TTFT at each level,
    medians over `reps`. Two engines in one process would share the cores' OpenMP teams badly (engine/threads.py),
    so each rep loads one engine, measures every level and shuts it down; reps alternate which goes first."""
    runs: dict[tuple[str, int], list[tuple]] = {}
    for rep in range(reps):
        for name in (list(variants) if rep % 2 == 0 else list(reversed(variants))):
            for c, result in engine_levels(model, threads, levels, max_tokens, **variants[name]).items():
                runs.setdefault((name, c), []).append(result)
    measured, baseline = variants
    for c in levels:
        rate = {}
        for name in variants:
            rs = runs[(name, c)]
            wall, ttft = statistics.median(r[1] for r in rs), statistics.median(r[2] for r in rs)
            rate[name] = rs[0][0] / wall
            print(f"{name:7s} c={c:<2d} {rate[name]:7.1f} tok/s, TTFT {ttft * 1000:6.0f} ms (median of {reps})")
        print(f"c={c}: {measured}/{baseline} tok/s {rate[measured] / rate[baseline]:.2f}x")


def start_llama_server(model: str, slots: int, threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([LLAMA_SERVER, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
                             "-c", str(2048 * slots), "-t", str(threads), "-tb", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("llama-server did not become healthy")


def llama_request(url: str, prompt: list[int], max_tokens: int, start: float, out: list) -> None:
    body = json.dumps({"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True, "cache_prompt": False}).encode()
    req = urllib.request.Request(f"{url}/completion", body, {"Content-Type": "application/json"})
    first, tokens = None, 0
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            first = first or time.perf_counter()
            if event.get("stop"):
                tokens = event.get("tokens_predicted", tokens)
    out.append((tokens, first - start))


def run_llama(url: str, prompts: list[list[int]], max_tokens: int) -> tuple[int, float, float]:
    results: list = []
    start = time.perf_counter()
    threads = [threading.Thread(target=llama_request, args=(url, p, max_tokens, start, results)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return sum(r[0] for r in results), wall, sum(r[1] for r in results) / len(results)


def run_hf(model, prompts: list[list[int]], max_tokens: int) -> tuple[int, float, float]:
    import torch
    width = max(len(p) for p in prompts)  # left padding, as generate() wants for a batch
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = dict(attention_mask=mask, do_sample=False, eos_token_id=None, pad_token_id=0)
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=1, **kwargs)
    ttft = time.perf_counter() - start
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, **kwargs)
    return (out.shape[1] - width) * len(prompts), time.perf_counter() - start, ttft


def measure(systems: dict[str, Callable], levels: list[int], prompts: list[list[int]], max_tokens: int,
            reps: int) -> list[Result]:
    """Each system at each level, reps times, systems interleaved so that load from other processes hits them
    alike; one Result per system and level with the median wall time and TTFT."""
    for run in systems.values():
        run(prompts[:1], 4)  # warm-up
    runs: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
    for _ in range(reps):
        for system, run in systems.items():
            for c in levels:
                runs.setdefault((system, c), []).append(run(prompts[:c], max_tokens))
    results = []
    for (system, c), rs in runs.items():
        tokens, wall, ttft = rs[0][0], statistics.median(r[1] for r in rs), statistics.median(r[2] for r in rs)
        results.append(Result(system, c, tokens, wall, ttft))
        print(f"{system:13s} c={c:<2d} {tokens:4d} tokens in {wall:6.2f}s = {tokens / wall:7.1f} tok/s, "
              f"TTFT {ttft * 1000:7.0f} ms  (median of {len(rs)})", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for every system")
    ap.add_argument("--dtype", default="auto",
                    help="the engine's weight/KV dtype (auto: bfloat16 where the CPU has it natively)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved runs of Velo and llama-server (medians)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--background-load", type=int, default=0, metavar="N",
                    help="N busy processes beside both systems for the whole run")
    ap.add_argument("--kv-dtype", default="auto", help="the engine's KV cache dtype (auto or int8)")
    ap.add_argument("--compile", action="store_true", help="the engine's decode steps through torch.compile")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    bandwidth = memory_bandwidth(threads=args.threads)
    # no prefix cache: llama-server is asked not to reuse prompts either, and the reps repeat them
    engine = LLMEngine.from_pretrained(args.model, EngineConfig(num_threads=args.threads, dtype=args.dtype,
                                                                progress=False, enable_prefix_cache=False,
                                                                kv_dtype=args.kv_dtype, compile=args.compile))
    prompts = chat_prompts(engine.tokenizer, max(levels))
    systems = {"velo-engine": lambda p, n: run_velo(engine, p, n)}
    bytes_per_token = {"velo-engine": decode_bytes(engine.runner.model)}
    proc = None
    if not args.skip_llama and os.path.exists(LLAMA_SERVER):
        proc, url = start_llama_server(args.model, max(levels), args.threads)
        systems["llama-server"] = lambda p, n: run_llama(url, p, n)
        bytes_per_token["llama-server"] = gguf_decode_bytes(args.model)
    try:
        with background_load(args.background_load, seconds=3600):
            results = measure(systems, levels, prompts, args.max_tokens, args.reps)
    finally:
        engine.shutdown()  # before transformers runs here: its OpenMP team would slow the engine's (engine/threads.py)
        if proc:
            proc.kill()
    print_roofline(results, bandwidth, bytes_per_token)
    if not args.skip_hf:
        import torch
        import transformers
        torch.set_num_threads(args.threads)
        os.environ["HF_HUB_OFFLINE"] = "1"
        folder, name = os.path.split(args.model)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name).eval()
        with torch.inference_mode():
            results += measure({"transformers": lambda p, n: run_hf(model, p, n)}, levels, prompts, args.max_tokens, 1)
    velo = {r.concurrency: r for r in results if r.system == "velo-engine"}
    for r in results:
        if r.system != "velo-engine":
            v = velo[r.concurrency]
            print(f"c={r.concurrency}: velo/{r.system} tok/s ratio {v.tok_s / r.tok_s:.2f}, "
                  f"TTFT ratio {v.ttft_s / r.ttft_s:.2f} (lower TTFT is better)")


if __name__ == "__main__":
    main()
