"""What a `/v1/completions` prompt array buys over sending its prompts one by one: the same prompts, through the same
Velo (as `velo serve` starts it, on the embedded engine with the shipped SmolLM2-135M), the baseline measured in the
same run. A third arm sends the batch as token ids (lm-eval's `local-completions` does), which must answer the same
text in the same time.

    python bench/completions_batch.py [--prompts 8] [--tokens 32] [--reps 3]

Greedy, at most `--tokens` tokens (the same prompts stop alike in every arm), Velo's cache off, so every rep
generates. The batch's prompts run as jobs side by side and the engine decodes them in one batch; one by one, each
waits for the last. Prints the median seconds of each and their ratios.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.default_model import default_model_path  # noqa: E402
from engine.loader import gguf_tokenizer  # noqa: E402
from tests.velo_serve import velo_serve  # noqa: E402

MODEL = "smollm2:135m"
CONFIG = '[cache]\nenabled = false\n[[backends]]\nname = "engine"\nkind = "engine"\n'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    prompts = [f"Item {i}: a short note about the number {i}." for i in range(args.prompts)]
    ask = dict(model=MODEL, max_tokens=args.tokens, temperature=0)
    batch_s, single_s, ids_s = [], [], []
    with tempfile.TemporaryDirectory() as folder, velo_serve(Path(folder), CONFIG) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        client.completions.create(prompt="warm up", **ask)
        tokenizer = gguf_tokenizer(default_model_path())
        ids = [tokenizer.encode(prompt) for prompt in prompts]
        for _ in range(args.reps):  # alternating, so machine noise hits every arm alike
            started = time.perf_counter()
            out = client.completions.create(prompt=prompts, **ask)
            batch_s.append(time.perf_counter() - started)
            assert len(out.choices) == len(prompts)
            started = time.perf_counter()
            by_ids = client.completions.create(prompt=ids, **ask)
            ids_s.append(time.perf_counter() - started)
            assert [c.text for c in by_ids.choices] == [c.text for c in out.choices]
            started = time.perf_counter()
            for prompt in prompts:
                client.completions.create(prompt=prompt, **ask)
            single_s.append(time.perf_counter() - started)
    batch, single, as_ids = statistics.median(batch_s), statistics.median(single_s), statistics.median(ids_s)
    print(f"completions    {args.prompts} prompts x {args.tokens} tokens, median of {args.reps}: one batch "
          f"{batch:.2f} s, one by one {single:.2f} s ({batch / single:.2f}x the time, {single / batch:.2f}x the speed)")
    print(f"completions    the batch as token ids {as_ids:.2f} s ({as_ids / batch:.2f}x the text batch's time), "
          "the same answers")


if __name__ == "__main__":
    main()
