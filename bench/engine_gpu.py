"""Velo's engine vs transformers generate() on a Llama-3.2-1B-shaped model with random weights, in one run.

    python bench/engine_gpu.py [--device cuda] [--shape 1b|tiny] [--batch 256] [--tokens 128] [--skip-hf]

Made for the lent GPU machine (no model weights travel there, so the weights are random, the shapes real):
a random `transformers` Llama of the chosen shape is saved as a Hugging Face folder and loaded by Velo's own
loader, so both systems run the same weights in bfloat16. Figures, all greedy with end-of-sequence ignored:
- batch 1: decode tok/s for --tokens tokens (after the first);
- --batch concurrent sequences with random prompt (32-512) and output (32-2*--tokens) lengths: aggregate
  generated tok/s, and the KV waste (allocated-but-unused slots / allocated) sampled while they run;
- transformers: batch 1, and --batch equal-length sequences (prompt 128, --tokens new tokens), the
  friendliest case for its padded batch.
`--shape tiny --device cpu` runs the same script in seconds, to check it on a machine without a GPU.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

SHAPES = {  # Llama-3.2-1B, and a small stand-in of the same family for a CPU check
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
               rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
               tie_word_embeddings=True),
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True),
}


def save_random_model(shape: dict, device: str, path: str) -> "torch.nn.Module":
    """A random-weight transformers Llama saved to path with a word-level tokenizer over its vocabulary."""
    import transformers
    from tokenizers import Tokenizer, models

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**shape, bos_token_id=None, eos_token_id=None)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()
    model.save_pretrained(path, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(shape["vocab_size"])}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": None}, f)
    return model


def synced(device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


async def velo_run(engine: LLMEngine, prompts: list[list[int]], outputs: list[int]) -> tuple[float, list[float]]:
    """All prompts at once; returns (aggregate generated tok/s, decode tok/s of each request after its first token)."""
    async def one(prompt: list[int], n: int) -> float:
        stamps = []
        async for out in engine.generate(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)):
            stamps += [time.perf_counter()] * len(out.token_ids)
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    start = time.perf_counter()
    rates = await asyncio.gather(*(one(p, n) for p, n in zip(prompts, outputs)))
    return sum(outputs) / (time.perf_counter() - start), rates


def sample_waste(engine: LLMEngine, stop: threading.Event, into: list[float]) -> None:
    while not stop.wait(0.05):
        m = engine.metrics()
        if m["running"]:
            into.append(m["kv_waste"])


def hf_rate(model, batch: int, prompt_len: int, tokens: int, device: str) -> float:
    """transformers generate(): generated tok/s for `batch` equal-length greedy sequences."""
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device=device)
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    model.generate(ids[:, :8], **(kwargs | {"max_new_tokens": 2, "min_new_tokens": 2}))  # warm-up
    start = synced(device)
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    return batch * tokens / (synced(device) - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--kv-gib", type=float, default=16)
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    shape, rng = SHAPES[args.shape], random.Random(0)
    with tempfile.TemporaryDirectory() as path:
        hf_model = save_random_model(shape, args.device, path)
        engine = LLMEngine.from_pretrained(path, EngineConfig(
            device=args.device, dtype="bfloat16", kv_memory=int(args.kv_gib * 2**30),
            max_num_seqs=args.batch, progress=False))
        try:
            vocab = shape["vocab_size"]
            asyncio.run(velo_run(engine, [[1, 2, 3]], [4]))  # warm-up
            _, (single,) = asyncio.run(velo_run(engine, [[rng.randrange(vocab) for _ in range(128)]], [args.tokens]))
            prompts = [[rng.randrange(vocab) for _ in range(rng.randint(32, 512))] for _ in range(args.batch)]
            outputs = [rng.randint(32, 2 * args.tokens) for _ in range(args.batch)]
            waste, stop = [], threading.Event()
            sampler = threading.Thread(target=sample_waste, args=(engine, stop, waste))
            sampler.start()
            aggregate, _ = asyncio.run(velo_run(engine, prompts, outputs))
            stop.set()
            sampler.join()
        finally:
            engine.shutdown()
        name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
        print(f"{args.shape} shape, random weights, bfloat16, {name}; greedy, end-of-sequence ignored")
        print(f"velo  batch 1: {single:8.1f} tok/s decode  (goal for 1b on H100: >= 600)")
        print(f"velo  {args.batch} sequences of random lengths: {aggregate:8.1f} tok/s aggregate "
              f"(goal for 1b on H100: >= 20,000), KV waste mean {statistics.mean(waste or [0]):.1%}, "
              f"max {max(waste or [0]):.1%} (goal < 4%)")
        if not args.skip_hf:
            hf1 = hf_rate(hf_model, 1, 128, args.tokens, args.device)
            hfb = hf_rate(hf_model, args.batch, 128, args.tokens, args.device)
            print(f"transformers batch 1: {hf1:8.1f} tok/s  -> velo {single / hf1:.2f}x")
            print(f"transformers {args.batch} equal-length sequences: {hfb:8.1f} tok/s  -> velo {aggregate / hfb:.2f}x")


if __name__ == "__main__":
    main()
