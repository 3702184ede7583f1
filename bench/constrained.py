"""Per-token cost of JSON-Schema-constrained decoding vs free decoding, in one run.

SmolLM2-135M-Instruct (the shipped GGUF) at batch 1, greedy, asked for a JSON object: once free (same
number of tokens, end-of-sequence ignored) and once constrained by a nested schema (it stops where the
schema is complete). Figures: decode ms/token for each and their ratio, and the masking work alone
(llguidance mask + token consume + logits masking) replayed over the constrained output's tokens.

    python bench/constrained.py [--reps 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jsonschema
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine import EngineConfig, LLMEngine, SamplingParams, default_model_path  # noqa: E402
from engine.constrained import Constrainer  # noqa: E402
from engine.grammar import grammar_for  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "languages", "address"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                         "languages": {"type": "array", "maxItems": 4, "items": {"enum": ["en", "fr", "de", "es"]}},
                         "address": {"type": "object", "required": ["city", "zip"], "additionalProperties": False,
                                     "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}
PROMPT = "Describe a fictional person as a JSON object with name, age, languages and address (city, zip)."


def run(eng: LLMEngine, prompt: list[int], params: SamplingParams) -> tuple[str, int, float]:
    """(text, tokens, decode seconds per token after the first)."""
    async def go():
        stamps, text = [], []
        async for out in eng.generate(prompt, params):
            stamps += [time.perf_counter()] * len(out.token_ids)
            text.append(out.text)
        return "".join(text), stamps

    text, stamps = asyncio.run(go())
    return text, len(stamps), (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def mask_cost(c: Constrainer, grammar: str, tokens: list[int], vocab: int) -> float:
    """Seconds per token of the constraint work alone, replayed over tokens."""
    m = c.matcher(grammar)
    logits = torch.randn(1, vocab)
    start = time.perf_counter()
    for t in tokens:
        c.mask(logits, [m])
        c.advance(m, t)
    return (time.perf_counter() - start) / len(tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    eng = LLMEngine.from_pretrained(default_model_path(), EngineConfig(progress=False, kv_memory=64 * 2**20))
    tok = eng.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]))
    grammar = grammar_for(SCHEMA)
    start = time.perf_counter()
    c = Constrainer(tok, eng.runner.model.cfg.vocab_size)
    setup = time.perf_counter() - start
    text, n, _ = run(eng, prompt, SamplingParams(max_tokens=200, temperature=0, grammar=grammar))  # warm-up
    jsonschema.validate(json.loads(text), SCHEMA)
    free_params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    free, constrained = [], []
    for _ in range(args.reps):  # interleaved, so load from other processes hits both alike
        free.append(run(eng, prompt, free_params)[2])
        constrained.append(run(eng, prompt, SamplingParams(max_tokens=200, temperature=0, grammar=grammar))[2])
    eng.shutdown()
    ids = tok.encode(text, add_special_tokens=False) + tok.eos_token_ids[:1]
    mask = statistics.median(mask_cost(c, grammar, ids, eng.runner.model.cfg.vocab_size) for _ in range(5))
    f, k = statistics.median(free), statistics.median(constrained)
    dtype = str(eng.config.torch_dtype()).removeprefix("torch.")
    print(f"SmolLM2-135M Q4_1->{dtype}, CPU threads={torch.get_num_threads()}, batch 1, greedy, {n} tokens, "
          f"median of {args.reps}; llguidance tokenizer setup {setup * 1000:.0f} ms (once per engine)")
    print(f"output: {text}")
    print(f"free        {f * 1000:7.2f} ms/token")
    print(f"constrained {k * 1000:7.2f} ms/token  ({k / f:.3f}x, {(k - f) * 1000:+.2f} ms/token)")
    print(f"masking alone {mask * 1000:.3f} ms/token ({mask / f:.1%} of a free decode step)")


if __name__ == "__main__":
    main()
