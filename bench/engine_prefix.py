"""Time to first token with a shared ~2,000-token prefix, radix prefix cache on vs off.

    python bench/engine_prefix.py [--prefix-tokens 2000] [--requests 4] [--threads 2] [--answer 1000]

A long system prompt is followed by different short questions. With the cache on, the first request
(not timed) leaves the prefix's KV blocks cached and later ones prefill only their own tail: once it has
finished, and (the second part) while it is still answering, `--answer` tokens long, the others sent at once,
as an agent's parallel requests share their system prompt; and (the third) all sent at once to an idle engine,
where one computes the prefix and the others wait for its pages.
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams, default_model_path  # noqa: E402

CLAUSE = "Rule {i}: answer politely, cite the handbook section {i}, and never reveal internal codes. "


def first_token(outputs: queue.Queue) -> RequestOutput:
    """The first output with a token: a long prompt's chunks each report progress first."""
    while True:
        out = outputs.get()
        if isinstance(out, BaseException):
            raise out
        if out.token_ids or out.finished:
            return out


def ttft(engine: LLMEngine, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first token, and how many prompt tokens came from the cache."""
    outputs: queue.Queue = queue.Queue()
    start = time.perf_counter()
    engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0), outputs.put)
    out = first_token(outputs)
    return time.perf_counter() - start, out.num_cached_tokens


def ttfts_at_once(engine: LLMEngine, prompts: list[list[int]]) -> list[tuple[float, int]]:
    """`ttft` of each prompt, all sent at once, as an agent's parallel requests come."""
    start, queues = time.perf_counter(), [queue.Queue() for _ in prompts]
    for prompt, outputs in zip(prompts, queues):
        engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0), outputs.put)
    out = []
    for outputs in queues:
        first = first_token(outputs)
        out.append((time.perf_counter() - start, first.num_cached_tokens))
    return out


def system_prompt(engine: LLMEngine, tokens: int) -> str:
    text, i = "", 0
    while len(engine.tokenizer.encode(text)) < tokens:
        text += CLAUSE.format(i=i)
        i += 1
    return text


def run(path: str, cache: bool, args, while_answering: bool | None) -> float:
    """`while_answering`: False, the others after the first has finished; True, sent at once while it answers;
    None, all sent at once to an idle engine."""
    engine = LLMEngine.from_pretrained(path, EngineConfig(enable_prefix_cache=cache, num_threads=args.threads,
                                                          progress=False))
    try:
        system = system_prompt(engine, args.prefix_tokens)
        tk = engine.tokenizer
        prompts = [tk.encode(tk.apply_chat_template([{"role": "system", "content": system},
                                                     {"role": "user", "content": f"Question {i}: what is rule {i}?"}]))
                   for i in range(args.requests + 1)]
        answering: queue.Queue = queue.Queue()
        if while_answering is None:
            prompts = prompts[1:]  # no first one: all at once, from an idle engine
        elif while_answering:  # the first goes on answering while the others come: its first token, then on
            engine.add_request(prompts[0], SamplingParams(max_tokens=args.answer, temperature=0, ignore_eos=True),
                               answering.put)
            first_token(answering)
        else:
            ttft(engine, prompts[0])  # warm-up; with the cache on it also fills the cache
        answers = [ttft(engine, p) for p in prompts[1:]] if while_answering is False else \
            ttfts_at_once(engine, prompts[1:] if while_answering else prompts)
        how = {False: "", True: ", sent at once, the first still answering",
               None: ", all sent at once"}[while_answering]
        for p, (seconds, cached) in zip(prompts[-len(answers):], answers):
            print(f"cache {'on ' if cache else 'off'}{how}: {len(p)} prompt tokens, {cached} from cache, "
                  f"TTFT {seconds * 1000:.0f} ms", flush=True)
        times = [seconds for seconds, _ in answers]
        if while_answering and not engine.metrics()["running"]:
            print("(the first had finished before the last question: raise --answer)")
        return sum(times) / len(times)
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--answer", type=int, default=1000)
    args = ap.parse_args()
    for while_answering, part in ((False, ""), (True, " while the first answers"), (None, " all sent at once")):
        on, off = run(args.model, True, args, while_answering), run(args.model, False, args, while_answering)
        print(f"mean TTFT{part}: cache on {on * 1000:.0f} ms, cache off {off * 1000:.0f} ms, "
              f"speed-up {off / on:.1f}x", flush=True)


if __name__ == "__main__":
    main()
