"""Precision and recall of the semantic cache per similarity threshold, with and without the false-hit guard.

Protocol (GPTCache's benchmark, on its QQP pairs in /work/shared/data/qqp_similar_pairs.json.gz): insert every
`origin` of the first N pairs into one scope, query every `similar`; no hit is a miss. precision = correct /
hits, recall = correct / queries. A hit is decided exactly as `ScopeIndex.search` decides it: the best of the
k nearest at or above the threshold that passes the guard. Two ways to call a hit correct:
- labelled (the figure the default threshold is chosen on): the hit's origin is a labelled duplicate of the
  query, i.e. in the same cluster of the QQP duplicate graph (all 30,141 pairs, joined transitively). QQP asks
  the same popular questions many times, so a hit on another origin is often a hit on the same question;
- strict (GPTCache's own scoring): only the query's own origin counts, even when another origin is the same
  text. Read as a lower bound.

A second set, written here, holds must-miss pairs (numbers, names, negation, code that differ): every hit on
it is false. Its false-hit rate is reported per threshold with and without the guard.

    python bench/semantic_quality.py [--pairs 4000] [--precision int8|float32] [--out bench/out]

Embeddings are cached in the out folder, so a rerun only recomputes the figures and the plot.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from proxy.cache.encoders import PRECISIONS, SentenceEncoder, default_model_path, load_encoder  # noqa: E402
from proxy.cache.guard import Signature, compatible, signature  # noqa: E402

QQP = Path("/work/shared/data/qqp_similar_pairs.json.gz")
THRESHOLDS = [0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98]
K = 8  # as ScopeIndex.search


def must_miss_pairs() -> list[tuple[str, str]]:
    """Stored question, then a query that looks alike but needs another answer."""
    pairs = []
    for a, b in [(2, 3), (10, 100), (7, 8), (1990, 1991), (12, 21), (3.5, 5.3)]:
        pairs += [(f"What is {a} times 17?", f"What is {b} times 17?"),
                  (f"Convert {a} miles to kilometers", f"Convert {b} miles to kilometers"),
                  (f"Write a poem of {a} lines about the sea", f"Write a poem of {b} lines about the sea")]
    for a, b in [("Austria", "Australia"), ("France", "Germany"), ("Python", "Java"), ("Paris", "Lyon"),
                 ("Einstein", "Newton"), ("Toyota", "Honda"), ("React", "Vue"), ("Mars", "Venus")]:
        pairs += [(f"Tell me about the history of {a}", f"Tell me about the history of {b}"),
                  (f"What are the pros and cons of {a}?", f"What are the pros and cons of {b}?")]
    for claim in ["it is safe to eat raw eggs", "coffee is good for your health", "the function is pure",
                  "cats can eat chocolate", "this code is thread safe", "the earth is flat"]:
        negated = claim.replace(" is ", " is not ").replace(" can ", " cannot ")
        pairs += [(f"Explain why {claim}", f"Explain why {negated}"),
                  (f"Is it true that {claim}?", f"Is it false that {claim}?")]
    for a, b in [("list.sort()", "sorted(list)"), ("x += 1", "x -= 1"), ("a == b", "a is b"),
                 ("os.path.join", "os.path.split"), ("dict.get", "dict.pop"), ("SELECT *", "SELECT 1")]:
        pairs += [(f"What does `{a}` do in Python?", f"What does `{b}` do in Python?"),
                  (f"Explain {a} to a beginner", f"Explain {b} to a beginner")]
    return pairs


def embed(encoder: SentenceEncoder, texts: list[str], cache: Path) -> np.ndarray:
    """The proxy's own encoder on texts; vectors kept in `cache`, named by the encoder (model files, precision)."""
    cache = cache.with_name(f"{cache.stem}_{encoder.name}{cache.suffix}")
    if cache.exists():
        return np.load(cache)
    started = time.perf_counter()
    vectors = encoder.encode(texts)
    print(f"embedded {len(texts)} texts in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    np.save(cache, vectors)
    return vectors


def neighbours(stored: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import faiss
    index = faiss.IndexFlatIP(stored.shape[1])
    index.add(stored)
    return index.search(queries, K)


def decide(scores: np.ndarray, ids: np.ndarray, query: Signature, stored: list[Signature], threshold: float,
           guard: bool) -> int:
    """The stored entry the cache answers with, or -1."""
    for s, i in zip(scores, ids):
        if i >= 0 and s >= threshold and (not guard or compatible(query, stored[i])):
            return int(i)
    return -1


def duplicate_clusters(pairs: list[dict]) -> Callable[[str], str]:
    """Union-find over the labelled duplicate pairs: text -> its cluster's representative."""
    parent: dict[str, str] = {}

    def find(text: str) -> str:
        parent.setdefault(text, text)
        while parent[text] != text:
            parent[text] = parent[parent[text]]
            text = parent[text]
        return text

    for p in pairs:
        parent[find(p["origin"])] = find(p["similar"])
    return find


Row = tuple[float, float, float, float]  # threshold, labelled precision, labelled recall, strict precision


def qqp_figures(encoder: SentenceEncoder, pairs: list[dict], cluster: Callable[[str], str],
                out: Path) -> dict[bool, list[Row]]:
    origins, similars = [p["origin"] for p in pairs], [p["similar"] for p in pairs]
    vectors = embed(encoder, origins + similars, out / f"qqp_{len(pairs)}.npy")
    scores, ids = neighbours(vectors[:len(pairs)], vectors[len(pairs):])
    stored, queries = [signature(t) for t in origins], [signature(t) for t in similars]
    figures: dict[bool, list[Row]] = {}
    for guard in (False, True):
        rows = []
        for t in THRESHOLDS:
            chosen = [decide(scores[q], ids[q], queries[q], stored, t, guard) for q in range(len(pairs))]
            hits = [(q, c) for q, c in enumerate(chosen) if c >= 0]
            labelled = sum(cluster(origins[c]) == cluster(origins[q]) for q, c in hits)
            strict = sum(c == q for q, c in hits)
            n = max(len(hits), 1)
            rows.append((t, labelled / n, labelled / len(pairs), strict / n))
        figures[guard] = rows
    return figures


def must_miss_rates(encoder: SentenceEncoder, out: Path) -> dict[bool, list[float]]:
    pairs = must_miss_pairs()
    vectors = embed(encoder, [a for a, _ in pairs] + [b for _, b in pairs], out / f"must_miss_{len(pairs)}.npy")
    n = len(pairs)
    stored = [signature(a) for a, _ in pairs]
    rates: dict[bool, list[float]] = {}
    for guard in (False, True):
        rates[guard] = []
        for t in THRESHOLDS:  # each pair alone in its scope: a hit is the pair's own stored text
            sims = (vectors[:n] * vectors[n:]).sum(axis=1)
            false = sum(1 for i, (_, b) in enumerate(pairs)
                        if sims[i] >= t and (not guard or compatible(signature(b), stored[i])))
            rates[guard].append(false / n)
    return rates


def plot(figures: dict, rates: dict, precision: str, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for guard, style in ((False, "--"), (True, "-")):
        label = "guard on" if guard else "guard off"
        ax.plot(THRESHOLDS, [r[1] for r in figures[guard]], "b" + style, marker="o", label=f"precision, {label}")
        ax.plot(THRESHOLDS, [r[2] for r in figures[guard]], "g" + style, marker="o", label=f"recall, {label}")
        ax.plot(THRESHOLDS, [r[3] for r in figures[guard]], "c" + style, marker=".",
                label=f"strict precision, {label}")
        ax.plot(THRESHOLDS, rates[guard], "r" + style, marker="x", label=f"must-miss false-hit rate, {label}")
    ax.axhline(0.98, color="grey", lw=0.8)
    ax.set_xlabel("cosine similarity threshold")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    ax.set_title(f"Velo semantic cache: all-MiniLM-L6-v2 ({precision}) on QQP pairs")
    path = out / f"semantic_quality_{precision}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4000, help="QQP pairs used (the first N of 30,141)")
    parser.add_argument("--precision", choices=PRECISIONS, default="int8", help="the encoder's, as [cache] has it")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    every = json.loads(gzip.open(QQP).read())
    pairs = every[:args.pairs]
    encoder = load_encoder(default_model_path(), args.precision)
    figures = qqp_figures(encoder, pairs, duplicate_clusters(every), args.out)
    rates = must_miss_rates(encoder, args.out)
    print(f"QQP: {len(pairs)} pairs; must-miss: {len(must_miss_pairs())} pairs; encoder {encoder.name}")
    print("            ----- guard off -----------   ----- guard on ------------   must-miss false-hit rate")
    print("threshold   precision  recall  strict    precision  recall  strict    guard off  guard on")
    for i, t in enumerate(THRESHOLDS):
        (_, p0, r0, s0), (_, p1, r1, s1) = figures[False][i], figures[True][i]
        print(f"{t:9.3f}   {p0:9.4f}  {r0:6.3f}  {s0:6.3f}    {p1:9.4f}  {r1:6.3f}  {s1:6.3f}    "
              f"{rates[False][i]:9.3f}  {rates[True][i]:8.3f}")
    good = [r[0] for r in figures[True] if r[1] >= 0.98]
    print(f"lowest threshold with precision >= 0.98 (guard on): {min(good) if good else 'none'}")
    print(f"plot: {plot(figures, rates, args.precision, args.out)}")


if __name__ == "__main__":
    main()
