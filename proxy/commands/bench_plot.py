"""The PNG `velo bench` writes: latency and speed against concurrency, side by side.

Drawn on a bare `matplotlib.figure.Figure` (no pyplot): no global state, no display needed.
"""
from __future__ import annotations

from pathlib import Path

from .bench_stats import LevelResult


def plot(levels: list[LevelResult], title: str, path: Path) -> None:
    from matplotlib.figure import Figure  # imported here: 0.5 s that only this step pays

    xs = [r.concurrency for r in levels]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    fig.suptitle(title)
    ttft, speed = fig.subplots(1, 2)
    for label, values in (("TTFT p50", [r.ttft_p50_s for r in levels]), ("TTFT p99", [r.ttft_p99_s for r in levels])):
        ttft.plot(xs, [None if v is None else v * 1000 for v in values], marker="o", label=label)
    ttft.set_ylabel("time to first token (ms)")
    speed.plot(xs, [r.stream_tok_s_p50 for r in levels], marker="o", label="per stream (p50)")
    speed.plot(xs, [r.aggregate_tok_s for r in levels], marker="o", label="all streams")
    speed.set_ylabel("output tokens / s")
    for ax in (ttft, speed):
        ax.set_xlabel("concurrent requests")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.savefig(path, dpi=100)
