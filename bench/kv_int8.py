"""The int8 KV cache (kv_dtype = "int8") against the compute-dtype cache, in one run: bytes per token, quality as
perplexity on a fixed text, and decode tok/s / TTFT at 1 and 8 concurrent requests.

    python bench/kv_int8.py [--model PATH.gguf] [--tokens 1024] [--chunk 32] [--reps 3] [--max-tokens 64]

Perplexity: the text (Python's own reference topics from `pydoc_data`, fixed per Python version) runs through
the paged cache in chunks of --chunk tokens, so every position attends to keys read back from the cache, as in
decoding. Speed: bench/engine_cpu.py compare_configs, one engine at a time, reps alternating which goes first,
medians.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.engine_cpu import compare_configs  # noqa: E402
from engine import EngineConfig, default_model_path  # noqa: E402
from engine import kv_store  # noqa: E402
from engine.loader import load  # noqa: E402
from engine.model_runner import ModelRunner, StepInput  # noqa: E402
from engine.threads import in_passing_thread  # noqa: E402


def fixed_text() -> str:
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in ("if", "while", "for", "try", "with", "function", "class", "assignment"))


@torch.inference_mode()
def perplexity(model, ids: list[int], chunk: int, kv_int8: bool, block_size: int = 16) -> float:
    """exp(mean negative log-likelihood) of ids[1:], computed chunk by chunk through a paged cache."""
    runner = ModelRunner(model, len(ids) // block_size + 1, block_size, kv_int8)
    table = list(range(len(ids) // block_size + 1))
    nll = 0.0
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start:min(start + chunk, len(ids) - 1)]
        slots = [table[p // block_size] * block_size + p % block_size for p in range(start, start + len(piece))]
        logits = runner.execute([StepInput(piece, start, slots, table, True, len(piece), prompt=True)])
        targets = torch.tensor(ids[start + 1:start + 1 + len(piece)])
        nll -= torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).sum().item()
    return math.exp(nll / (len(ids) - 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--tokens", type=int, default=1024, help="tokens of the fixed text to score")
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = in_passing_thread(load, args.model, EngineConfig().torch_dtype(), progress=False)
    ids = loaded.tokenizer.encode(fixed_text())[:args.tokens]
    ppl = {q: in_passing_thread(perplexity, loaded.model, ids, args.chunk, q) for q in (False, True)}
    cfg, dtype = loaded.model.cfg, loaded.model.embed_tokens.weight.dtype
    size = {q: kv_store.bytes_per_token(cfg, dtype, q) for q in (False, True)}
    name = str(dtype).removeprefix("torch.")
    print(f"{os.path.basename(args.model)}: KV bytes per token {name} {size[False]}, int8 {size[True]} "
          f"({size[True] / size[False]:.3f}x)")
    print(f"perplexity over {len(ids)} tokens, chunks of {args.chunk}: {name} {ppl[False]:.4f}, int8 {ppl[True]:.4f} "
          f"({(ppl[True] / ppl[False] - 1) * 100:+.2f}%)")
    del loaded
    compare_configs(args.model, args.threads, [int(c) for c in args.concurrency.split(",")], args.max_tokens,
                    args.reps, {"int8": {"kv_dtype": "int8"}, name: {"kv_dtype": "auto"}})


if __name__ == "__main__":
    main()
