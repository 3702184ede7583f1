"""Velo's engine vs transformers generate() on a Llama-3.2-1B-shaped model with random weights, in one run.

    python bench/engine_gpu.py [--device cuda] [--shape 1b|tiny] [--batch 256] [--skip-hf]

Made for the lent GPU machine (no model weights travel there, so the weights are random, the shapes real):
a random `transformers` Llama of the chosen shape is saved as a Hugging Face folder and loaded by Velo's own
loader, so both systems run the same weights in bfloat16. Figures, all greedy with end-of-sequence ignored:
- the memory roofline: a device-to-device copy's bandwidth (bytes read + written) over the bytes one decode step
  must read (every weight once), the batch-1 decode rate no implementation can beat;
- batch 1: decode tok/s for 128 tokens (after the first), with CUDA graphs and without (eager launches);
- --batch concurrent sequences with random prompt and output lengths of 100-1024 each (nano-vllm's bench):
  aggregate generated tok/s, and the KV waste (allocated-but-unused slots / allocated) sampled while they run;
- prefix cache: time to first token of a prompt of a 2k-token shared prefix + 32 new tokens, the prefix cached
  (same cache scope as a request before) against not (a fresh scope);
- transformers: batch 1, and --batch equal-length sequences (prompt 128, 128 new tokens), the friendliest case
  for its padded batch; and how many leading greedy tokens of one prompt the two agree on (random weights in
  bf16 have near-ties, so they part after a while; tests/engine/test_cuda.py checks equality in float32).
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


async def velo_run(engine: LLMEngine, prompts: list[list[int]], outputs: list[int],
                   scope: str = "") -> tuple[float, list[float]]:
    """All prompts at once; returns (aggregate generated tok/s, decode tok/s of each request after its first token)."""
    async def one(prompt: list[int], n: int) -> float:
        stamps = []
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        async for out in engine.generate(prompt, params, cache_scope=scope):
            stamps += [time.perf_counter()] * len(out.token_ids)
        return (len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-9)

    start = time.perf_counter()
    rates = await asyncio.gather(*(one(p, n) for p, n in zip(prompts, outputs)))
    return sum(outputs) / (time.perf_counter() - start), rates


def sample_waste(engine: LLMEngine, stop: threading.Event, into: list[float]) -> None:
    while not stop.wait(0.05):
        m = engine.metrics()
        if m["running"]:
            into.append(m["kv_waste"])


def ttft(engine: LLMEngine, prompt: list[int], scope: str) -> float:
    async def first() -> float:
        start = time.perf_counter()
        async for _ in engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0), cache_scope=scope):
            return time.perf_counter() - start
    return asyncio.run(first())


def profile_steps(engine: LLMEngine, prompts: list[list[int]]) -> None:
    import cProfile
    import pstats
    prof, step = cProfile.Profile(), engine._step

    def profiled() -> None:
        prof.enable()
        try:
            step()
        finally:
            prof.disable()
    engine._step = profiled
    asyncio.run(velo_run(engine, prompts, [128] * len(prompts)))
    engine._step = step
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)


def recapture(engine: LLMEngine, fused: bool) -> None:
    """The decode graphs captured anew (a fresh pool), on the engine thread, with the fused kernels or without."""
    from concurrent.futures import Future

    from engine.cuda_graphs import DecodeGraphs

    def again(_) -> None:
        runner, old = engine.runner, engine.runner.graphs
        shape = (old.max_batch, old.max_blocks, old.block_size, old.scratch_block, runner.device)
        runner.graphs, runner.fuse_graphs = None, fused
        del old
        runner.graphs = DecodeGraphs(runner._decode_logits, *shape)
        runner.graphs.capture_all()
    done: Future = Future()
    engine._inbox.put(("call", (again, None, done)))
    done.result()


def replay_ms(graphs) -> float:
    """GPU time of one replay of the batch-1 decode graph (median of 50, CUDA events)."""
    graph = graphs._graphs[1].graph
    times = []
    for _ in range(53):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[3:])


def copy_bandwidth(device: str) -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy (median of 20)."""
    src = torch.randn(2**28, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(23):
        start = synced(device)
        dst.copy_(src)
        times.append(synced(device) - start)
    return 2 * src.numel() * src.element_size() / statistics.median(times[3:])


def velo_greedy(engine: LLMEngine, prompt: list[int], n: int) -> list[int]:
    async def run() -> list[int]:
        return [t async for out in engine.generate(prompt, SamplingParams(max_tokens=n, temperature=0,
                                                                             ignore_eos=True)) for t in out.token_ids]
    return asyncio.run(run())


def hf_greedy(model, prompt: list[int], n: int, device: str) -> list[int]:
    ids = torch.tensor([prompt], device=device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


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
    ap.add_argument("--kv-gib", type=float, default=24)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--no-graphs", action="store_true", help="decode steps launched op by op (cuda_graphs = false)")
    ap.add_argument("--profile", action="store_true", help="at the end, where a step's host time goes (cProfile of "
                    "the engine thread over 64 sequences x 128 tokens; not part of any figure)")
    args = ap.parse_args()
    shape, rng = SHAPES[args.shape], random.Random(0)
    with tempfile.TemporaryDirectory() as path:
        hf_model = save_random_model(shape, args.device, path)
        engine = LLMEngine.from_pretrained(path, EngineConfig(
            device=args.device, dtype="bfloat16", kv_memory=int(args.kv_gib * 2**30),
            max_num_seqs=args.batch, progress=False, cuda_graphs=not args.no_graphs))
        name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
        print(f"{args.shape} shape, random weights, bfloat16, {name}; greedy, end-of-sequence ignored", flush=True)
        try:
            vocab = shape["vocab_size"]
            weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
            roofline = copy_bandwidth(args.device) / weight_bytes
            print(f"memory roofline: copy {roofline * weight_bytes / 1e12:.2f} TB/s over {weight_bytes / 1e9:.2f} GB "
                  f"of weights a step = {roofline:.0f} tok/s at batch 1", flush=True)
            asyncio.run(velo_run(engine, [[1, 2, 3]], [4]))  # warm-up
            one = [rng.randrange(vocab) for _ in range(128)]
            _, (single,) = asyncio.run(velo_run(engine, [one], [128]))
            graphs, engine.runner.graphs = engine.runner.graphs, None  # the same step, launched op by op
            _, (eager,) = asyncio.run(velo_run(engine, [one], [128])) if graphs else (None, (single,))
            engine.runner.graphs = graphs
            print(f"velo  batch 1: {single:8.1f} tok/s decode = {single / roofline:.0%} of the roofline "
                  f"(goal >= 600 tok/s and >= 50%); without CUDA graphs {eager:.1f} tok/s -> graphs "
                  f"{single / eager:.2f}x", flush=True)
            if graphs and args.device.startswith("cuda"):
                replay = replay_ms(graphs)
                print(f"      a batch-1 step's graph replay alone: {replay:.3f} ms of GPU time = "
                      f"{1e3 / replay:.0f} tok/s, {1e3 / replay / roofline:.0%} of the roofline; the rest of a "
                      f"{1e3 / single:.3f} ms step is the host's", flush=True)
                recapture(engine, fused=False)  # RMSNorm, RoPE and SwiGLU as eager ops
                _, (unfused,) = asyncio.run(velo_run(engine, [one], [128]))
                unfused_replay = replay_ms(engine.runner.graphs)
                recapture(engine, fused=True)
                print(f"      without the fused RMSNorm/RoPE/SwiGLU: {unfused:.1f} tok/s, replay {unfused_replay:.3f} "
                      f"ms -> fusion {single / unfused:.2f}x", flush=True)
            prefix = [rng.randrange(vocab) for _ in range(2048)]
            cold, warm = [], []
            for i in range(4):
                suffix = [rng.randrange(vocab) for _ in range(32)]
                ttft(engine, prefix + [rng.randrange(vocab) for _ in range(32)], "warm")  # caches the prefix
                warm.append(ttft(engine, prefix + suffix, "warm"))
                cold.append(ttft(engine, prefix + suffix, f"cold{i}"))
            on, off = statistics.median(warm[1:]), statistics.median(cold[1:])
            print(f"velo  prefix cache, 2k shared + 32 new: TTFT {on * 1e3:.1f} ms cached vs {off * 1e3:.1f} ms not "
                  f"-> {off / on:.1f}x (goal >= 10x)", flush=True)
            prompts = [[rng.randrange(vocab) for _ in range(rng.randint(100, 1024))] for _ in range(args.batch)]
            outputs = [rng.randint(100, 1024) for _ in range(args.batch)]
            waste, stop = [], threading.Event()
            sampler = threading.Thread(target=sample_waste, args=(engine, stop, waste))
            sampler.start()
            aggregate, _ = asyncio.run(velo_run(engine, prompts, outputs))
            stop.set()
            sampler.join()
            print(f"velo  {args.batch} sequences of random lengths: {aggregate:8.1f} tok/s aggregate "
                  f"(goal >= 20,000), KV waste mean {statistics.mean(waste or [0]):.1%}, "
                  f"max {max(waste or [0]):.1%} (goal < 4%)", flush=True)
            mine = velo_greedy(engine, one, 32)
            if args.profile:
                profile_steps(engine, [[rng.randrange(vocab) for _ in range(200)] for _ in range(64)])
        finally:
            engine.shutdown()
        if not args.skip_hf:
            theirs = hf_greedy(hf_model, one, 32, args.device)
            agree = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), len(mine))
            print(f"greedy tokens equal to transformers': the first {agree} of 32", flush=True)
            hf1 = hf_rate(hf_model, 1, 128, 128, args.device)
            print(f"transformers batch 1: {hf1:8.1f} tok/s  -> velo {single / hf1:.2f}x", flush=True)
            hfb = hf_rate(hf_model, args.batch, 128, 128, args.device)
            print(f"transformers {args.batch} equal-length sequences: {hfb:8.1f} tok/s  -> velo {aggregate / hfb:.2f}x")


if __name__ == "__main__":
    main()
