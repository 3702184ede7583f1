"""Two words both texts share that traded places: "rows to columns" / "columns to rows", "does a dog chase a cat" /
"does a cat chase a dog", "replace tabs with spaces" / "replace spaces with tabs". An embedding reads a text as a
bag of meaning and scores these at ~0.99; only the order of the words tells who does what to whom."""
from __future__ import annotations

import bisect

from .reading import Reading

_DIRECTIONAL = frozenset("to in into onto from than toward towards over before after above below under versus "
                         "beats beat vs".split()) - {"vs", "versus"}
# Prepositions: what they stand between plays a part in a relation ("replace tabs with spaces"), so two words that
# trade places across one trade parts; "and", "or", articles and the like join or mark things either way round
_RELATIONS = _DIRECTIONAL | frozenset("with without within of by for per on at as via about against among through "
                                      "across upon".split())
_PIVOT_SPAN = 6  # tokens from one swapped word to the other: wider, it is clauses that moved, not roles


def direction_reversed(a: Reading, b: Reading) -> bool:
    """The texts read their directional words ("to", "than", "from") between other words, one of them the other way
    round: "convert rows to columns" / "convert columns to rows"."""
    return _directions(a) != _directions(b) and _reversed(a, b)


def _directions(r: Reading) -> set[tuple[str, str, str]]:
    """(word before, directional word, word after) for each directional word, nearest content words each side;
    before "than" the compared thing, not the comparative ("Apple is more expensive than Dell": apple, dell)."""
    content_at = dict(zip(r.where, r.content))
    out = set()
    for k, tok in enumerate(r.tokens):
        if tok not in _DIRECTIONAL:
            continue
        left = [i for i in r.where if i < k]
        if tok == "than" and left and left[-1] == k - 1 and _comparative(r.tokens, k - 1):
            left.pop()
        right = [i for i in r.where if i > k]
        if left and right:
            out.add((content_at[left[-1]], tok, content_at[right[0]]))
    return out


def _comparative(tokens: tuple[str, ...], i: int) -> bool:
    """tokens[i], just before "than", is the comparative ("faster", "more acidic"), not the compared thing."""
    return tokens[i].endswith("er") or i > 0 and tokens[i - 1] in ("more", "less")


def _reversed(a: Reading, b: Reading) -> bool:
    """A (x, to, y) of one text is (y, to, x) in the other and not also (x, to, y) there."""
    da, db = _directions(a), _directions(b)
    return any((y, d, x) in db and (x, d, y) not in db and x != y for x, d, y in da) or \
        any((y, d, x) in da and (x, d, y) not in da and x != y for x, d, y in db)


def swapped(a: Reading, b: Reading) -> bool:
    """Two nearby shared words in one order in `a` and the other in `b`, across a shared word that stays between
    them in both ("does a dog chase a cat" / "does a cat chase a dog"), or a preposition ("replace tabs with spaces"
    / "replace spaces with tabs", "merge the feature branch into main" / "merge main into the feature branch": cosine
    0.991 and 0.984; `direction_reversed` reads only the words next to a directional one)."""
    start, end_a, end_b = _apart(a, b)
    pos_a, pos_b = _once(a.content, start, end_a), _once(b.content, start, end_b)
    whole_a, whole_b = _once(a.content), _once(b.content)  # a pivot is once in all of the text
    shared = sorted((w for w in pos_a if w in pos_b), key=pos_a.get)
    for i, x in enumerate(shared):
        for y in shared[i + 1:]:
            if pos_b[x] < pos_b[y]:
                continue
            xa, ya, xb, yb = a.where[pos_a[x]], a.where[pos_a[y]], b.where[pos_b[x]], b.where[pos_b[y]]
            if not xb - yb <= _PIVOT_SPAN >= ya - xa:
                continue
            pivots = {w for w in a.content[pos_a[x] + 1:pos_a[y]] if w in whole_b and w in whole_a}
            if any(pos_b[y] < whole_b[p] < pos_b[x] for p in pivots) \
                    or _RELATIONS.intersection(a.tokens[xa + 1:ya], b.tokens[yb + 1:xb]):
                return True
    return False


def _once(content: tuple[str, ...], start: int = 0, end: int | None = None) -> dict[str, int]:
    """Each word once in content[start:end] -> its place in `content`."""
    seen: dict[str, int] = {}
    for i in range(start, len(content) if end is None else end):
        seen[content[i]] = -1 if content[i] in seen else i
    return {w: i for w, i in seen.items() if i >= 0}


def _apart(a: Reading, b: Reading) -> tuple[int, int, int]:
    """Where the texts' content words differ: from the first after the tokens both start with, to the last before
    those both end with (in `a`, in `b`). A word of a preamble both share is no word of the question: "<a preamble
    naming orders and customers> count orders per customer" / "… count customers per order" held each twice."""
    head = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), min(len(a.tokens), len(b.tokens)))
    room = min(len(a.tokens), len(b.tokens)) - head
    tail = next((i for i, (x, y) in enumerate(zip(reversed(a.tokens), reversed(b.tokens))) if x != y or i == room),
                room)
    start = bisect.bisect_left(a.where, head)
    return start, bisect.bisect_left(a.where, len(a.tokens) - tail), bisect.bisect_left(b.where, len(b.tokens) - tail)
