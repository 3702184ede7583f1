"""What moved from one clause to another: a negation ("why can't I sleep when I am tired" / "why can I sleep when
I am not tired"), words ("time in new york when it is noon in london" / "... in london when it is noon in new
york"), or the word that opens a clause ("why am I tired when I wake up" / "why do I wake up when I am tired"). The
words are the same in both texts and too far apart for word_order.py: only the clauses that hold them tell."""
from __future__ import annotations

from collections import Counter

from .reading import Reading


def moved_negation(a: Reading, b: Reading) -> bool:
    """A negated clause of `a` whose closest clause in `b` (most shared words, then nearest in place) is not
    negated."""
    if len(b.clauses) < 2:
        return False
    for at, (words, negated) in enumerate(a.clauses):
        if not negated or not words:
            continue
        closest = max(range(len(b.clauses)), key=lambda j: (len(words & b.clauses[j][0]), -abs(j - at)))
        if words & b.clauses[closest][0] and not b.clauses[closest][1]:
            return True
    return False


def clauses_traded(a: Reading, b: Reading) -> bool:
    """The same content words in clauses that traded what they hold (`_words_traded`) or how they are joined
    (`_opener_moved`): "what time is it in new york when it is noon in london?" was served the answer to "what time
    is it in london when it is noon in new york?" (cosine 0.986), "why do I feel tired when I wake up early?" the one
    to "why do I wake up early when I feel tired?" (0.975): words too far apart for `word_order.swapped`."""
    return Counter(a.content) == Counter(b.content) and (_words_traded(a, b) or _opener_moved(a, b))


def _words_traded(a: Reading, b: Reading) -> bool:
    """Two clauses of one text that each share words with the same two clauses of the other. One word moved to
    another clause ("what would happen if X was banned" / "what will happen to X if it is banned") touches one
    clause of the other text from the first: the same question."""
    in_a, in_b = _clause_of(a), _clause_of(b)
    touches: dict[int, set[int]] = {}
    for word in in_a.keys() & in_b.keys():
        touches.setdefault(in_a[word], set()).add(in_b[word])
    groups = [g for g in touches.values() if len(g) > 1]
    return any(len(g & h) > 1 for i, g in enumerate(groups) for h in groups[i + 1:])


def _clause_of(r: Reading) -> dict[str, int]:
    """Each content word that is in one clause only -> that clause's place."""
    seen: dict[str, int] = {}
    for place, (words, _) in enumerate(r.clauses):
        for word in words:
            seen[word] = -1 if word in seen else place
    return {w: place for w, place in seen.items() if place >= 0}


def _opener_moved(a: Reading, b: Reading) -> bool:
    """The same clauses and the same words opening them ("when", "if"), but on other clauses. A clause moved whole
    with its opener ("when ..., what ...?") is the same question; another opener ("when" / "if") is left to the
    embedding."""
    opened_a, opened_b = _opened(a), _opened(b)
    return opened_a != opened_b and sorted(opened_a.values()) == sorted(opened_b.values()) \
        and {w for w, _ in a.clauses if w} == {w for w, _ in b.clauses if w}


def _opened(r: Reading) -> dict[frozenset[str], str]:
    """The words of each clause a word opened ("when", "if") -> that word."""
    return {words: opener for (words, _), opener in zip(r.clauses, r.openers) if words and opener}
