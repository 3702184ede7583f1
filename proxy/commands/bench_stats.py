"""The figures `velo bench` reports, computed from one `Sample` per request.

Per-stream speed is decode speed, tokens after the first over the time after the first, as Velo's own
`velo_tokens_per_second` metric counts it; aggregate speed is all tokens of a level over its wall time.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Sample:
    """One request as the client saw it; times in seconds from sending it."""

    ttft: float | None  # None: no text came (an error, or an empty answer)
    total: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache: str = ""  # X-Velo-Cache
    error: str = ""
    from_usage: bool = True  # False: the server reported no usage, completion_tokens counts streamed chunks

    @property
    def decode_rate(self) -> float | None:
        if self.ttft is None or self.completion_tokens < 2 or self.total <= self.ttft:
            return None
        return (self.completion_tokens - 1) / (self.total - self.ttft)


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    stream_tok_s_p50: float | None
    aggregate_tok_s: float
    prompt_tokens_mean: float
    output_tokens_mean: float
    first_error: str = ""

    @classmethod
    def of(cls, concurrency: int, samples: list[Sample], wall_s: float) -> "LevelResult":
        ok = [s for s in samples if not s.error]
        ttfts = [s.ttft for s in ok if s.ttft is not None]
        rates = [r for s in ok if (r := s.decode_rate) is not None]
        tokens = sum(s.completion_tokens for s in ok)
        return cls(concurrency=concurrency, requests=len(samples), errors=len(samples) - len(ok), wall_s=wall_s,
                   ttft_p50_s=percentile(ttfts, 50), ttft_p99_s=percentile(ttfts, 99),
                   stream_tok_s_p50=percentile(rates, 50), aggregate_tok_s=tokens / wall_s if wall_s > 0 else 0.0,
                   prompt_tokens_mean=float(np.mean([s.prompt_tokens for s in ok])) if ok else 0.0,
                   output_tokens_mean=tokens / len(ok) if ok else 0.0,
                   first_error=next((s.error for s in samples if s.error), ""))


@dataclass
class CacheResult:
    """A deterministic request (temperature 0) sent once, then repeated: the repeats should be cache hits."""

    miss_s: float
    miss_cache: str
    hit_p50_s: float | None
    hit_ttft_p50_s: float | None
    repeats: int
    hit_cache: str  # X-Velo-Cache of the repeats, e.g. "exact"; "" when the server is not a Velo
    error: str = ""

    @classmethod
    def of(cls, first: Sample, repeats: list[Sample]) -> "CacheResult":
        ok = [s for s in repeats if not s.error]
        return cls(miss_s=first.total, miss_cache=first.cache,
                   hit_p50_s=percentile([s.total for s in ok], 50),
                   hit_ttft_p50_s=percentile([s.ttft for s in ok if s.ttft is not None], 50),
                   repeats=len(ok), hit_cache="/".join(sorted({s.cache for s in ok})),
                   error=next((s.error for s in [first, *repeats] if s.error), ""))


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _ms(seconds: float | None) -> str:
    return _fmt(None if seconds is None else seconds * 1000, " ms", 0 if (seconds or 0) >= 0.1 else 2)


def table(levels: list[LevelResult]) -> str:
    head = f"{'concurrency':>11}  {'requests':>8}  {'errors':>6}  {'TTFT p50':>10}  {'TTFT p99':>10}  " \
           f"{'tok/s per stream':>16}  {'tok/s total':>11}  {'tokens in/out':>13}"
    rows = [f"{r.concurrency:>11}  {r.requests:>8}  {r.errors:>6}  {_ms(r.ttft_p50_s):>10}  {_ms(r.ttft_p99_s):>10}  "
            f"{_fmt(r.stream_tok_s_p50):>16}  {_fmt(r.aggregate_tok_s):>11}  "
            f"{f'{r.prompt_tokens_mean:.0f}/{r.output_tokens_mean:.0f}':>13}" for r in levels]
    return "\n".join([head, *rows])


def cache_line(c: CacheResult) -> str:
    if c.error:
        return f"the cache probe failed: {c.error}"
    if c.hit_cache in ("exact", "semantic"):
        ratio = f", {c.miss_s / c.hit_p50_s:.0f}x faster" if c.hit_p50_s else ""
        return (f"cache hit ({c.hit_cache}, p50 of {c.repeats}): {_ms(c.hit_p50_s)} whole answer, "
                f"TTFT {_ms(c.hit_ttft_p50_s)}; the miss took {_ms(c.miss_s)}{ratio}")
    why = f"X-Velo-Cache: {c.hit_cache}" if c.hit_cache else "no X-Velo-Cache header: not a Velo"
    return (f"no cache hit on the repeated request ({why}); repeats took {_ms(c.hit_p50_s)} (p50), "
            f"the first {_ms(c.miss_s)}")
