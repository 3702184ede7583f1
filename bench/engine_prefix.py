"""Time to first token with a shared ~2,000-token prefix, radix prefix cache on vs off.

    python bench/engine_prefix.py [--prefix-tokens 2000] [--requests 4] [--threads 2]

A long system prompt is followed by different short questions. With the cache on, the first request
(not timed) leaves the prefix's KV blocks cached and later ones prefill only their own tail.
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from engine import EngineConfig, LLMEngine, SamplingParams, default_model_path  # noqa: E402

CLAUSE = "Rule {i}: answer politely, cite the handbook section {i}, and never reveal internal codes. "


def ttft(engine: LLMEngine, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first token, and how many prompt tokens came from the cache."""
    outputs: queue.Queue = queue.Queue()
    start = time.perf_counter()
    engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0), outputs.put)
    out = outputs.get()
    if isinstance(out, BaseException):
        raise out
    return time.perf_counter() - start, out.num_cached_tokens


def system_prompt(engine: LLMEngine, tokens: int) -> str:
    text, i = "", 0
    while len(engine.tokenizer.encode(text)) < tokens:
        text += CLAUSE.format(i=i)
        i += 1
    return text


def run(path: str, cache: bool, args) -> float:
    engine = LLMEngine.from_pretrained(path, EngineConfig(enable_prefix_cache=cache, num_threads=args.threads,
                                                          progress=False))
    try:
        system = system_prompt(engine, args.prefix_tokens)
        tk = engine.tokenizer
        prompts = [tk.encode(tk.apply_chat_template([{"role": "system", "content": system},
                                                     {"role": "user", "content": f"Question {i}: what is rule {i}?"}]))
                   for i in range(args.requests + 1)]
        ttft(engine, prompts[0])  # warm-up; with the cache on it also fills the cache
        times = []
        for p in prompts[1:]:
            seconds, cached = ttft(engine, p)
            times.append(seconds)
            print(f"cache {'on ' if cache else 'off'}: {len(p)} prompt tokens, {cached} from cache, "
                  f"TTFT {seconds * 1000:.0f} ms", flush=True)
        return sum(times) / len(times)
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    on, off = run(args.model, True, args), run(args.model, False, args)
    print(f"mean TTFT: cache on {on * 1000:.0f} ms, cache off {off * 1000:.0f} ms, speed-up {off / on:.1f}x")


if __name__ == "__main__":
    main()
