"""What each sampling knob costs the engine: the same prompts decoded with greedy decoding (the baseline: the engine's
argmax shortcut, engine/sampling.py) and with the knobs that leave it, as tok/s ratios against the baseline measured
in the same run.

    python bench/sampling_cost.py [--max-tokens 32] [--concurrency 1,8] [--threads 2] [--reps 3] [--biased 16]

Every variant runs with `ignore_eos`, so each request produces exactly --max-tokens tokens; the variants run on one
engine (the knobs are per request), interleaved in a rotating order within each rep, and report medians. `logit_bias`
biases --biased token ids (an OpenAI client's usual map is a handful: banned words, a forced yes/no).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.engine_cpu import chat_prompts, run_velo  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams, default_model_path  # noqa: E402


def variants(max_tokens: int, biased: int) -> dict[str, SamplingParams]:
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    bias = {1000 + i: -5.0 for i in range(biased)}
    sampled = dataclasses.replace(greedy, temperature=0.7, top_p=0.9, top_k=40, seed=1)
    return {"greedy": greedy,
            "greedy + logit_bias": dataclasses.replace(greedy, logit_bias=bias),
            "greedy + repeat_penalty": dataclasses.replace(greedy, repetition_penalty=1.1, repeat_last_n=64),
            "greedy + logprobs": dataclasses.replace(greedy, logprobs=True, top_logprobs=5),
            "sampled (t, top_p, top_k)": sampled,
            "sampled + logit_bias": dataclasses.replace(sampled, logit_bias=bias)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--biased", type=int, default=16)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    table = variants(args.max_tokens, args.biased)
    engine = LLMEngine.from_pretrained(default_model_path(), EngineConfig(num_threads=args.threads, progress=False,
                                                                          enable_prefix_cache=False))
    try:
        prompts = chat_prompts(engine.tokenizer, max(levels))
        run_velo(engine, prompts[:1], 4)  # warm-up
        rates: dict[tuple[str, int], list[float]] = {}
        names = list(table)
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                for c in levels:
                    tokens, wall, _ = run_velo(engine, prompts[:c], args.max_tokens, table[name])
                    rates.setdefault((name, c), []).append(tokens / wall)
    finally:
        engine.shutdown()
    print(f"engine decode, {args.max_tokens} tokens a request, medians of {args.reps} reps, {args.threads} threads")
    for c in levels:
        base = statistics.median(rates[("greedy", c)])
        for name in names:
            rate = statistics.median(rates[(name, c)])
            print(f"c={c:<2d} {name:26s} {rate:7.1f} tok/s  {rate / base:.2f}x")


if __name__ == "__main__":
    main()
