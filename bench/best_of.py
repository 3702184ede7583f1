"""What OpenAI's `best_of` on /v1/completions (proxy/best_of.py) costs and buys, against the same prompts asked for
one sampled answer, in the same run, interleaved: Velo in front of the real llama-server with SmolLM2-135M (4 slots,
so the candidates run side by side), temperature 1:
- the wait for the answer (best_of candidates are parts of the request, as `n`'s choices);
- the mean log-probability per token of the answer returned, the score best_of ranks by (higher is likelier);
- the completion tokens billed (every candidate's, as OpenAI bills them).

    python bench/best_of.py [--best-of 4] [--rounds 3] [--tokens 24]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proxy_overhead import _velo  # noqa: E402
from tests.llama_server import chat_server  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time, a fox", "The best way to learn Python is",
           "In the morning I like to", "The ocean is", "My favourite book is about", "To make bread you need",
           "The moon looks"]


async def _ask(http: aiohttp.ClientSession, url: str, prompt: str, tokens: int, best_of: int) -> tuple[float, float,
                                                                                                       int]:
    """Seconds for one answer, its mean logprob per token, and the completion tokens billed."""
    body = {"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 1.0, "logprobs": 1}
    if best_of > 1:
        body["best_of"] = best_of
    start = time.perf_counter()
    async with http.post(url + "/v1/completions", json=body) as resp:
        answer = await resp.json()
        assert resp.status == 200, answer
    seconds = time.perf_counter() - start
    scores = answer["choices"][0]["logprobs"]["token_logprobs"]
    return seconds, statistics.fmean(scores) if scores else float("-inf"), answer["usage"]["completion_tokens"]


async def bench(url: str, best_of: int, rounds: int, tokens: int) -> None:
    sides: dict[str, list[tuple[float, float, int]]] = {"one answer": [], f"best_of {best_of}": []}
    async with aiohttp.ClientSession() as http:
        await _ask(http, url, PROMPTS[0], tokens, 1)  # the server's first request warms it
        for r in range(rounds):
            for i, prompt in enumerate(PROMPTS):
                order = [1, best_of] if (r + i) % 2 == 0 else [best_of, 1]
                for each in order:
                    sides["one answer" if each == 1 else f"best_of {best_of}"].append(
                        await _ask(http, url, prompt, tokens, each))
    (base, chosen) = sides.values()
    wait = statistics.median(s for s, _, _ in chosen) / statistics.median(s for s, _, _ in base)
    score_base, score_chosen = statistics.fmean(x for _, x, _ in base), statistics.fmean(x for _, x, _ in chosen)
    billed = sum(t for _, _, t in chosen) / sum(t for _, _, t in base)
    won = sum(c[1] > b[1] for b, c in zip(base, chosen)) / len(base)
    print(f"{len(base)} prompts each, SmolLM2-135M on llama-server (4 slots), temperature 1, {tokens} tokens")
    print(f"wait for the answer (median): {statistics.median(s for s, _, _ in chosen) * 1e3:.0f} ms against "
          f"{statistics.median(s for s, _, _ in base) * 1e3:.0f} ms: {wait:.2f}x")
    print(f"mean logprob per token of the answer: {score_chosen:.3f} against {score_base:.3f} "
          f"(+{score_chosen - score_base:.3f} nats; likelier than the single answer in {won:.0%} of prompts)")
    print(f"completion tokens billed: {billed:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--best-of", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    llama = chat_server(Path(tempfile.mkdtemp())).start()
    with ExitStack() as stack:
        stack.callback(llama.stop)
        url, _ = _velo(stack, "llamacpp", llama.url, models=("m",))
        asyncio.run(bench(url, args.best_of, args.rounds, args.tokens))


if __name__ == "__main__":
    main()
