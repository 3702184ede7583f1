"""`velo bench [MODEL]`: time to first token, tokens per second per stream and in total, at each concurrency
level, and the latency of a cache hit, measured through a running Velo (or any Ollama/OpenAI-compatible URL).

Every request streams through the OpenAI dialect and tokens are counted from the usage the server reports
(`stream_options.include_usage`). One warm-up request comes first (it may load the model; its time is reported
apart) and calibrates the prompt to about `--prompt-tokens` tokens of the server's own tokenizer. The timed
requests start with a tag of their own, so no prefix cache or coalescing can serve one from another, and send
`Cache-Control: no-cache`, so Velo's response cache neither answers nor keeps them. The cache probe sends one
request at temperature 0 and repeats it: from the second on, Velo should answer from its cache. Where the
server runs a GGUF on this machine (the embedded engine), the one-stream rate is also shown against the
machine's memory bandwidth (bench_roofline.py).
Writes PREFIX.json and PREFIX.png (`--out`).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from tqdm import tqdm

from . import CommandError, guarded
from .bench_roofline import roofline_line, served_gguf
from .bench_stats import CacheResult, LevelResult, Sample, cache_line, table
from .client import add_connection_args, chat_stream, check_model, open_session

FILLER = ("the river ran past an old mill where a miller kept his tools and told long stories to anyone who "
          "came by with grain in a cart").split()
NO_CACHE = {"Cache-Control": "no-cache"}


@dataclass
class BenchOptions:
    base: str
    model: str | None = None
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16])
    prompt_tokens: int = 256
    output_tokens: int = 128
    requests: int | None = None  # per level; None: twice the level, at least 4
    cache_repeats: int = 5
    api_key: str | None = None

    def requests_at(self, concurrency: int) -> int:
        return self.requests or max(4, 2 * concurrency)

    def total_requests(self) -> int:
        return 1 + sum(map(self.requests_at, self.concurrency)) + 1 + self.cache_repeats


@dataclass
class BenchReport:
    url: str
    model: str
    started: str
    prompt_tokens: int
    output_tokens: int
    warmup_s: float  # the first request, model loading included
    tokens_counted_from: str  # "usage" (the server's count) or "chunks" (a server that sent no usage)
    levels: list[LevelResult]
    cache: CacheResult
    gguf: str | None = None  # the model's file on this machine, where the server says (the embedded engine)


def prompt_text(words: int, tag: str) -> str:
    body = " ".join(FILLER[i % len(FILLER)] for i in range(words))
    return f"[{tag}] Continue this story in your own words, at length: {body}"


def calibrated_words(target_tokens: int, words_sent: int, tokens_counted: int) -> int:
    """Filler words for a prompt of about `target_tokens`, from what the server counted for `words_sent`
    (its chat template's tokens included); unchanged when the server reported no usage. English text runs
    0.7-1 words per token in the usual tokenizers: the clamp only stops a server whose count is off."""
    if not tokens_counted:
        return words_sent
    words_per_token = min(max(words_sent / tokens_counted, 0.25), 4.0)  # a server that counts oddly stays sane
    return max(1, round(target_tokens * words_per_token))


async def one_request(session: aiohttp.ClientSession, opts: BenchOptions, model: str, text: str,
                      headers: dict[str, str] | None = None, **options: Any) -> Sample:
    start, ttft, chunks = time.perf_counter(), None, 0
    messages = [{"role": "user", "content": text}]
    async with chat_stream(session, opts.base, model, messages, headers=headers, max_tokens=opts.output_tokens,
                           **options) as reply:
        async for _ in reply.texts():
            chunks += 1
            if ttft is None:
                ttft = time.perf_counter() - start
        usage = reply.usage or {}
    return Sample(ttft=ttft, total=time.perf_counter() - start, prompt_tokens=usage.get("prompt_tokens", 0),
                  completion_tokens=usage.get("completion_tokens", chunks), cache=reply.cache,
                  from_usage=bool(usage))


async def attempt(session: aiohttp.ClientSession, opts: BenchOptions, model: str, text: str,
                  headers: dict[str, str] | None = None, **options: Any) -> Sample:
    """`one_request`, with a failure kept in the sample instead of raised: one bad request ends no run."""
    start = time.perf_counter()
    try:
        return await one_request(session, opts, model, text, headers, **options)
    except CommandError as e:
        return Sample(ttft=None, total=time.perf_counter() - start, error=str(e))


async def run_level(session: aiohttp.ClientSession, opts: BenchOptions, model: str, words: int, concurrency: int,
                    tag: str, bar: tqdm) -> tuple[LevelResult, list[Sample]]:
    """`requests_at(concurrency)` requests, `concurrency` of them in flight at any time."""
    todo, samples = iter(range(opts.requests_at(concurrency))), []

    async def worker() -> None:
        for i in todo:  # one iterator shared by the workers: each request is taken once
            text = prompt_text(words, f"{tag} c{concurrency} r{i}")
            samples.append(await attempt(session, opts, model, text, NO_CACHE))
            bar.update(1)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, opts.requests_at(concurrency)))))
    result = LevelResult.of(concurrency, samples, time.perf_counter() - start)
    if result.errors == result.requests:
        raise CommandError(f"every request at concurrency {concurrency} failed: {result.first_error}")
    return result, samples


async def measure(opts: BenchOptions, bar: tqdm) -> BenchReport:
    tag, started = uuid.uuid4().hex[:8], time.strftime("%Y-%m-%dT%H:%M:%S%z")
    async with open_session(opts.api_key) as session:
        model = await check_model(session, opts.base, opts.model)
        bar.set_description("warm-up")
        warm = await one_request(session, opts, model, prompt_text(opts.prompt_tokens, f"{tag} warm-up"), NO_CACHE)
        bar.update(1)
        words = calibrated_words(opts.prompt_tokens, opts.prompt_tokens, warm.prompt_tokens)
        levels, samples = [], [warm]
        for c in opts.concurrency:
            bar.set_description(f"concurrency {c}")
            level, level_samples = await run_level(session, opts, model, words, c, tag, bar)
            levels.append(level)
            samples += level_samples
        bar.set_description("cache")
        text = prompt_text(words, f"{tag} cache")
        probes = []
        for _ in range(1 + opts.cache_repeats):
            probes.append(await attempt(session, opts, model, text, temperature=0))
            bar.update(1)
        gguf = await served_gguf(session, opts.base, model)
    counted = "usage" if all(s.from_usage for s in samples + probes if not s.error) else "chunks"
    return BenchReport(url=opts.base, model=model, started=started, prompt_tokens=opts.prompt_tokens,
                       output_tokens=opts.output_tokens, warmup_s=warm.total, tokens_counted_from=counted,
                       levels=levels, cache=CacheResult.of(probes[0], probes[1:]), gguf=gguf)


def output_prefix(out: str | None, default: str) -> Path:
    """PREFIX of PREFIX.json and PREFIX.png: `--out` less a .json or .png it ends with, and a folder (one that is
    there, or a path ending in /) gets the default name inside it. `--out .` failed once the whole run was done,
    `--out dir/` wrote dir.json beside the folder, `--out results.json` results.json.json."""
    if out is None:
        return Path(default)
    path = Path(out)
    if out.endswith(("/", os.sep)) or path.name in ("", "..") or path.is_dir():
        return path / default
    return path.with_suffix("") if path.suffix in (".json", ".png") else path


def write_outputs(report: BenchReport, prefix: Path) -> list[str]:
    """PREFIX.json always; PREFIX.png when matplotlib is there. Returns lines to print."""
    json_path, png = prefix.with_name(prefix.name + ".json"), prefix.with_name(prefix.name + ".png")
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_bytes(orjson.dumps(asdict(report), option=orjson.OPT_INDENT_2))
        lines = [f"wrote {json_path}"]
        try:
            from .bench_plot import plot
            plot(report.levels, f"{report.model} via {report.url}: prompt ~{report.prompt_tokens} tokens, "
                                f"output <= {report.output_tokens}", png)
            lines.append(f"wrote {png}")
        except ImportError:
            lines.append("no plot: matplotlib is not installed (pip install matplotlib)")
    except OSError as e:
        raise CommandError(f"cannot write the results under {prefix.parent}/: {e.strerror}") from None
    return lines


def summary(report: BenchReport) -> str:
    note = "" if report.tokens_counted_from == "usage" else \
        "\nthe server reported no usage: tokens were counted as streamed chunks"
    return (f"{report.model} at {report.url}: prompt ~{report.prompt_tokens} tokens, output up to "
            f"{report.output_tokens}\nfirst request (model loading included): {report.warmup_s:.2f} s\n"
            f"{table(report.levels)}\n{cache_line(report.cache)}{note}")


def run(args: argparse.Namespace) -> int:
    opts = BenchOptions(base=args.url.rstrip("/"), model=args.model, concurrency=args.concurrency,
                        prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, requests=args.requests,
                        cache_repeats=args.cache_repeats, api_key=args.api_key)
    with tqdm(total=opts.total_requests(), unit="req", file=sys.stderr, disable=None) as bar:
        report = asyncio.run(measure(opts, bar))
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", report.model).strip("-")
    prefix = output_prefix(args.out, f"velo-bench-{slug}-{time.strftime('%Y%m%d-%H%M%S')}")
    print(summary(report))
    one = next((r.stream_tok_s_p50 for r in report.levels if r.concurrency == 1), None)
    if report.gguf and one:
        print(roofline_line(report.gguf, one))
    print("\n".join(write_outputs(report, prefix)))
    return 0


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers separated by commas, like 1,4,16")
    return levels


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return int(text)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure a model through Velo: TTFT, tok/s, cache hits",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="model name (default: the first one the server lists)")
    add_connection_args(p)
    p.add_argument("--concurrency", type=_levels, default=[1, 4, 16], help="levels to run (default 1,4,16)")
    p.add_argument("--prompt-tokens", type=_positive, default=256, help="prompt length (default 256)")
    p.add_argument("--output-tokens", type=_positive, default=128, help="max_tokens per answer (default 128)")
    p.add_argument("--requests", type=_positive, help="requests per level (default: twice the level, at least 4)")
    p.add_argument("--cache-repeats", type=_positive, default=5, help="repeats of the cache probe (default 5)")
    p.add_argument("--out", help="prefix of the .json and .png files (default velo-bench-MODEL-TIME)")
    p.set_defaults(func=guarded("bench", run))
