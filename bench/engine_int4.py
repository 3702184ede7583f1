"""The engine with 4-bit GGUF matrices kept 4-bit (int4_weights, the default) against the same engine with every
weight dequantized, in one run: decode tok/s and TTFT at 1 and 8 concurrent requests.

    python bench/engine_int4.py [--model PATH.gguf] [--max-tokens 64] [--concurrency 1,8] [--reps 3]

Two engines in one process would share the cores' OpenMP teams badly (engine/threads.py), so each rep loads
one engine, measures every level, shuts it down, then loads the other; reps alternate which goes first.
Medians over reps; prompts and greedy `ignore_eos` decoding as in bench/engine_cpu.py, no prefix cache.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.engine_cpu import engine_levels  # noqa: E402
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
    runs: dict[tuple[bool, int], list[tuple]] = {}
    for rep in range(args.reps):
        for int4 in ((True, False) if rep % 2 == 0 else (False, True)):
            measured = engine_levels(args.model, args.threads, levels, args.max_tokens, int4_weights=int4)
            for c, result in measured.items():
                runs.setdefault((int4, c), []).append(result)
    print(f"{os.path.basename(args.model)}, {args.threads} threads, {args.max_tokens} tokens a request, "
          f"medians of {args.reps}")
    for c in levels:
        rate = {}
        for int4 in (True, False):
            rs = runs[(int4, c)]
            wall, ttft = statistics.median(r[1] for r in rs), statistics.median(r[2] for r in rs)
            rate[int4] = rs[0][0] / wall
            print(f"{'int4' if int4 else 'dense':5s} c={c:<2d} {rate[int4]:7.1f} tok/s, TTFT {ttft * 1000:6.0f} ms")
        print(f"c={c}: int4/dense tok/s {rate[True] / rate[False]:.2f}x")


if __name__ == "__main__":
    main()
