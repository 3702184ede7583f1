"""How often the shipped model (SmolLM2-135M on Velo's engine) loops, with and without the Ollama dialect's defaults.

    python bench/loops.py [--questions 8] [--cap 256] [--reps 1]

A chat UI's background requests (Open WebUI's follow-up suggestions, title and tags generation, as its task
templates word them) and a short chat answer, about the first `--questions` questions of
/work/shared/data/qqp_similar_pairs.json.gz, each sent as Open WebUI sends it: Ollama's /api/chat, not streamed,
no sampling option but the `num_predict` cap (and a seed per request, so a rerun draws the same). Through Velo in
this process, to the engine, under three model names that differ only in what fills the unset options:

- with defaults: the model itself; the resolve stage fills in Ollama's (temperature 0.8, top_k 40, top_p 0.9,
  min_p 0, repeat_penalty 1.1 over the last 64 tokens);
- without (as before): Ollama's defaults but no repetition penalty, what the engine adapter applied to every
  request before (llama-server's own defaults are of this kind: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05);
- plain: the engine's own sampling with nothing filled in (temperature 1, no top-k/top-p/min-p, no penalty).

An answer loops when it runs to the cap and some run of LOOP_NGRAM words comes back LOOP_REPEATS times or more.
Prints each condition's loop rate, answers at the cap and mean length, and the ratio of loop rates.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.base import BackendConfig  # noqa: E402
from proxy.app import make_app  # noqa: E402
from proxy.cache.config import CacheConfig  # noqa: E402
from proxy.config import Config  # noqa: E402
from proxy.presets import PresetsConfig  # noqa: E402

MODEL = "smollm2:135m"
QQP = Path("/work/shared/data/qqp_similar_pairs.json.gz")
LOOP_NGRAM, LOOP_REPEATS = 4, 3
CONDITIONS = {  # name -> (model name, the preset's parameters; None: the model itself)
    "with defaults": (MODEL, None),
    "without": ("loops-no-penalty", {"repeat_penalty": 1.0}),
    "plain": ("loops-plain", {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}),
}
HISTORY = "### Chat History:\n<chat_history>\nUSER: {q}\n</chat_history>"
TASKS = {  # Open WebUI's default task templates, shortened
    "follow-ups": "### Task:\nSuggest 3-5 relevant follow-up questions or prompts that the user might naturally ask "
                  "next in this conversation, based on the chat history.\n### Output:\nJSON format: "
                  '{{ "follow_ups": ["Question 1?", "Question 2?", "Question 3?"] }}\n' + HISTORY,
    "title": "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history.\n"
             '### Output:\nJSON format: {{ "title": "your concise title here" }}\n' + HISTORY,
    "tags": "### Task:\nGenerate 1-3 broad tags categorizing the main themes of the chat history, along with 1-3 "
            'more specific subtopic tags.\n### Output:\nJSON format: {{ "tags": ["tag1", "tag2", "tag3"] }}\n'
            + HISTORY,
    "chat": "{q}",
}


def loops(text: str) -> bool:
    words = text.split()
    grams = collections.Counter(tuple(words[i:i + LOOP_NGRAM]) for i in range(len(words) - LOOP_NGRAM + 1))
    return max(grams.values(), default=0) >= LOOP_REPEATS


def prompts(n: int) -> list[tuple[str, str]]:
    questions = [p["origin"] for p in json.loads(gzip.open(QQP).read())[:n]]
    return [(task, template.format(q=q)) for q in questions for task, template in TASKS.items()]


async def ask(client: TestClient, model: str, prompt: str, cap: int, seed: int) -> tuple[str, str, int]:
    resp = await client.post("/api/chat", json={"model": model, "stream": False, "options": {
        "num_predict": cap, "seed": seed}, "messages": [{"role": "user", "content": prompt}]})
    body = await resp.json()
    assert resp.status == 200, body
    return body["message"]["content"], body["done_reason"], body["eval_count"]


async def run(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="velo-loops-"))
    config = Config(backends=[BackendConfig(name="engine", kind="engine", options={"progress": False})],
                    cache=CacheConfig(enabled=False), presets=PresetsConfig(path=str(folder / "presets.json")))
    async with TestClient(TestServer(make_app(config)), timeout=ClientTimeout(total=None)) as client:
        for name, params in CONDITIONS.values():
            if params is not None:
                created = await client.post("/api/create", json={"model": name, "from": MODEL, "parameters": params,
                                                                  "stream": False})
                assert created.status == 200, await created.text()
        jobs = [(cond, task, prompt, seed) for seed, (task, prompt) in enumerate(prompts(args.questions) * args.reps)
                for cond in CONDITIONS]  # interleaved: every condition shares the batch alike
        started = time.perf_counter()
        answers = await asyncio.gather(*(ask(client, CONDITIONS[c][0], p, args.cap, seed) for c, _, p, seed in jobs))
    print(f"{len(jobs)} answers in {time.perf_counter() - started:.0f} s; cap {args.cap} tokens; a loop: the cap "
          f"reached and a {LOOP_NGRAM}-word run seen {LOOP_REPEATS}+ times")
    rates = {}
    for cond in CONDITIONS:
        mine = [(task, *a) for (c, task, _, _), a in zip(jobs, answers) if c == cond]
        looped = [task for task, text, reason, _ in mine if reason == "length" and loops(text)]
        capped = sum(reason == "length" for _, _, reason, _ in mine)
        rates[cond] = len(looped) / len(mine)
        by_task = ", ".join(f"{t} {looped.count(t)}" for t in TASKS)
        print(f"{cond:>14}: loops {len(looped)}/{len(mine)} = {rates[cond]:.0%} ({by_task}); at the cap "
              f"{capped}; mean {statistics.mean(n for *_, n in mine):.0f} tokens")
    with_, without = rates["with defaults"], rates["without"]
    ratio = f"{without / with_:.1f}x" if with_ else ("inf: no loop with the defaults" if without else "n/a: no loops")
    print(f"loop rate without / with defaults: {without:.0%} / {with_:.0%} = {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--cap", type=int, default=256, help="num_predict of every request")
    parser.add_argument("--reps", type=int, default=1, help="each prompt this many times (other seeds)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
