"""The engine with 4-bit GGUF matrices kept 4-bit (int4_weights, the default) against the same engine with every
weight dequantized, in one run: decode tok/s and TTFT at 1 and 8 concurrent requests.

    python bench/engine_int4.py [--model PATH.gguf] [--max-tokens 64] [--concurrency 1,8] [--reps 3]

One engine at a time, reps alternating which goes first (bench/engine_cpu.py compare_configs), medians over
reps; prompts and greedy `ignore_eos` decoding as in bench/engine_cpu.py, no prefix cache.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.engine_cpu import compare_configs  # noqa: E402
from engine import default_model_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"{os.path.basename(args.model)}, {args.threads} threads, {args.max_tokens} tokens a request")
    compare_configs(args.model, args.threads, levels, args.max_tokens, args.reps,
                    {"int4": {"int4_weights": True}, "dense": {"int4_weights": False}})


if __name__ == "__main__":
    main()
