"""What a wide verify pass costs against a one-token decode step, at batch 1 on this machine: the figure that
decides whether tree-shaped speculation (several draft branches verified in one pass) can pay. A linear draft of
k=6 tokens is verified over 7 rows, under the int4 kernel's limit (engine/int4.py INT4_MAX_ROWS = 8); a tree of
two branches needs about 13, so its pass runs on the dense weights, as a prompt pass does. The tree pays only if
the tokens it adds per pass outgrow what that pass costs more.

A dense pass over n positions is measured as the time to first token of a request whose prompt is a cached prefix
(--context tokens, in the radix cache) plus n fresh tokens, so it includes the request's admission; the first
row, n=1, shows that fixed part. The decode step is one stream's time per token after its first, in the same
run. Passes of each n take turns with the others, --reps times, and medians are reported.

    python bench/verify_cost.py [--model GGUF] [--context 64] [--positions 1,7,13,25] [--reps 7]
"""
from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from engine import EngineConfig, LLMEngine, SamplingParams, default_model_path  # noqa: E402


def first_token_s(engine: LLMEngine, prompt: list[int]) -> float:
    done: queue.Queue = queue.Queue()
    start = time.perf_counter()
    engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True),
                       lambda out: done.put(out if isinstance(out, BaseException) else time.perf_counter()))
    if isinstance(item := done.get(), BaseException):
        raise item
    return item - start


def decode_step_s(engine: LLMEngine, prompt: list[int], tokens: int = 17) -> float:
    done: queue.Queue = queue.Queue()
    stamps: list[float] = []

    def sink(out) -> None:
        if isinstance(out, BaseException) or out.finished:
            done.put(out)
        stamps.append(time.perf_counter())
    engine.add_request(prompt, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True), sink)
    if isinstance(item := done.get(), BaseException):
        raise item
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--context", type=int, default=64, help="cached prefix tokens (a multiple of the block size)")
    ap.add_argument("--positions", default="1,7,13,25")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    positions = [int(n) for n in args.positions.split(",")]
    engine = LLMEngine.from_pretrained(args.model, EngineConfig(num_threads=args.threads, progress=False))
    try:
        vocab = engine.tokenizer.vocab_size
        context = [(7 * i + 11) % 1000 + 100 for i in range(args.context)]
        first_token_s(engine, context + [5])  # the context enters the radix cache
        seconds: dict[int, list[float]] = {n: [] for n in positions}
        steps: list[float] = []
        for rep in range(args.reps + 1):  # the first round warms each shape up and is not counted
            for n in positions:
                fresh = [(rep * 131 + 17 * i + n) % (vocab - 1000) + 500 for i in range(n)]  # never cached
                took = first_token_s(engine, context + fresh)
                if rep:
                    seconds[n].append(took)
            steps.append(decode_step_s(engine, context + [rep + 3]))
    finally:
        engine.shutdown()
    step = statistics.median(steps)
    print(f"{os.path.basename(args.model)}: a decode step (int4, one row) {step * 1e3:.1f} ms; a dense pass over n new "
          f"positions after {args.context} cached, admission included (median of {args.reps}):")
    for n in positions:
        t = statistics.median(seconds[n])
        print(f"  n={n:3d}  {t * 1e3:7.1f} ms  {t / step:5.2f} decode steps")


if __name__ == "__main__":
    main()
