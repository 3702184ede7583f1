"""Must-miss pairs made from QQP questions, one generator per way a look-alike question needs another answer.

Each pair is (a real QQP question, the same question changed so that its answer changes). The word lists here
are the benchmark's own, written apart from proxy/cache/opposites.py; where the two overlap, the opposites
category measures that lexicon's coverage more than its reach (said in the bench's output).
"""
from __future__ import annotations

import random
import re
from collections import Counter
from typing import Callable

OPPOSITES = [("increase", "decrease"), ("rows", "columns"), ("include", "exclude"), ("before", "after"),
             ("encode", "decode"), ("buy", "sell"), ("upload", "download"), ("import", "export"),
             ("gain", "lose"), ("start", "stop"), ("best", "worst"), ("advantages", "disadvantages"),
             ("pros", "cons"), ("rich", "poor"), ("cheap", "expensive"), ("fast", "slow"), ("easy", "hard"),
             ("love", "hate"), ("increase", "reduce"), ("hot", "cold"), ("up", "down"), ("open", "close"),
             ("enable", "disable"), ("install", "uninstall"), ("male", "female"), ("men", "women"),
             ("boyfriend", "girlfriend"), ("husband", "wife"), ("win", "lose"), ("positive", "negative"),
             ("legal", "illegal"), ("possible", "impossible"), ("good", "bad"), ("first", "last"),
             ("send", "receive"), ("add", "remove"), ("strong", "weak"), ("happy", "sad"), ("public", "private"),
             ("online", "offline"), ("old", "young"), ("long", "short"), ("higher", "lower"), ("more", "less"),
             ("friend", "enemy"), ("true", "false"), ("left", "right"), ("North", "South"), ("East", "West")]
ENTITIES = [("dog", "cat"), ("coffee", "tea"), ("rice", "pasta"), ("car", "bike"), ("laptop", "tablet"),
            ("book", "movie"), ("doctor", "lawyer"), ("engineer", "designer"), ("iPhone", "iPad"),
            ("Android", "Windows"), ("chicken", "fish"), ("beer", "wine"), ("guitar", "piano"),
            ("football", "cricket"), ("apple", "banana"), ("bank", "school"), ("milk", "juice"),
            ("hair", "skin"), ("teeth", "eyes"), ("house", "apartment"), ("job", "internship"),
            ("exam", "interview"), ("email", "password"), ("novel", "poem"), ("vodka", "whiskey"),
            ("Java", "Ruby"), ("Python", "Perl"), ("programming", "painting"), ("weight", "height"),
            ("money", "time"), ("website", "app"), ("photo", "video"), ("song", "album")]
_NEG = re.compile(r"\b(don't|doesn't|didn't|can't|won't|isn't|aren't|wasn't|shouldn't|wouldn't|couldn't|not)\b")
_UNNEGATED = {"don't": "do", "doesn't": "does", "didn't": "did", "can't": "can", "won't": "will", "isn't": "is",
              "aren't": "are", "wasn't": "was", "shouldn't": "should", "wouldn't": "would", "couldn't": "could",
              "not": ""}
_AUX = re.compile(r"\b(is|are|do|does|did|can|could|will|would|should|was|were)\b( (?:I|you|we|they|he|she|it|"
                  r"people|one)\b)?")
_CLAUSE = re.compile(r"\b(?:when|if|because|but|while|although|that|so)\b|[,;?]")
_COMPARED = re.compile(r"\b(\w+) ((?:is |are )?(?:better|worse|faster|slower|bigger|smaller|stronger|weaker|safer|"
                       r"cheaper|easier|harder|older|younger|more \w+|less \w+) than) (\w+)\b")
_DIRECTED = re.compile(r"\bfrom (\w+) (to|into) (\w+)\b|\b([A-Z]\w+) (to|into) ([A-Z]\w+)\b|"
                       r"\b([Cc]onvert|[Tt]ranslate|[Ss]witch|[Mm]ove|[Mm]igrate) (\w+) (to|into) (\w+)\b")
_NUMBER = re.compile(r"\b\d+\b")
_NUMBER_WORDS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
_NAME = re.compile(r"(?<=[a-z,] )([A-Z][a-z]{2,})\b")
# Swapping these is no swap of roles ("ROOT to How", "from my to iTunes"): only content words trade places.
_SKIP_AS_WORD = set("""the a an is are it this that what which where when why how who do does did be to and or i
me my you your he him his she her we us our they them their years months days ever other others some all any
many much more most less least getting get make being have has can could will would should there was were been
as its those thing nothing anything something really significantly upon way ways people""".split())


def _word_swap(pairs: list[tuple[str, str]]) -> Callable[[str], str | None]:
    """Replace the first listed word found (either side of a pair) by its partner, keeping the case."""
    table = {a.lower(): b for a, b in pairs} | {b.lower(): a for a, b in pairs}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, table)) + r")\b", re.I)

    def change(text: str) -> str | None:
        m = pattern.search(text)
        if m is None:
            return None
        new = table[m.group().lower()]
        new = new[0].upper() + new[1:] if m.group()[0].isupper() else new
        return text[:m.start()] + new + text[m.end():]
    return change


def _order_swap(text: str) -> str | None:
    m = _COMPARED.search(text)
    if m and m.group(1).lower() not in _SKIP_AS_WORD and m.group(1)[0].isalpha() \
            and m.group(3).lower() not in _SKIP_AS_WORD and m.group(1).lower() != m.group(3).lower():
        return text[:m.start()] + f"{m.group(3)} {m.group(2)} {m.group(1)}" + text[m.end():]
    m = _DIRECTED.search(text)
    if m is None:
        return None
    g = m.groups()
    if g[0]:
        x, link, y, head = g[0], g[1], g[2], "from "
    elif g[3]:
        x, link, y, head = g[3], g[4], g[5], ""
    else:
        x, link, y, head = g[7], g[8], g[9], g[6] + " "
    if x.lower() in _SKIP_AS_WORD or y.lower() in _SKIP_AS_WORD or x.lower() == y.lower():
        return None
    return text[:m.start()] + f"{head}{y} {link} {x}" + text[m.end():]


def _moved_negation(text: str) -> str | None:
    """Take the one negation out of its clause and put it into another clause that has an auxiliary."""
    negs = list(_NEG.finditer(text))
    if len(negs) != 1:
        return None
    neg = negs[0]
    bounds = [0] + [m.end() for m in _CLAUSE.finditer(text)] + [len(text)]
    home = next(i for i in range(len(bounds) - 1) if bounds[i] <= neg.start() < bounds[i + 1])
    for i in range(len(bounds) - 1):
        if i == home:
            continue
        aux = _AUX.search(text, bounds[i], bounds[i + 1])
        if aux is None or aux.end() > bounds[i + 1]:
            continue
        plain = _UNNEGATED[neg.group()]
        removed = text[:neg.start()] + plain + text[neg.end():]
        shift = len(plain) - len(neg.group()) if aux.start() > neg.start() else 0
        at = aux.end() + shift
        moved = removed[:at] + " not" + removed[at:]
        return re.sub(r"  +", " ", moved)
    return None


def _number(text: str) -> str | None:
    m = _NUMBER.search(text)
    if m is not None:
        return text[:m.start()] + str(int(m.group()) + 1) + text[m.end():]
    for i, w in enumerate(_NUMBER_WORDS):
        m = re.search(rf"\b{w}\b", text, re.I)
        if m:
            other = _NUMBER_WORDS[(i + 1) % len(_NUMBER_WORDS)]
            return text[:m.start()] + other + text[m.end():]
    return None


def _name_swap(names: list[str], rng: random.Random) -> Callable[[str], str | None]:
    def change(text: str) -> str | None:
        m = _NAME.search(text)
        if m is None or m.group(1) not in names:
            return None
        other = rng.choice([n for n in names if n.lower() not in text.lower()])
        return text[:m.start(1)] + other + text[m.end(1):]
    return change


def _frequent_names(texts: list[str]) -> list[str]:
    counts = Counter(m.group(1) for t in texts for m in _NAME.finditer(t))
    lower = Counter(w for t in texts for w in re.findall(r"\b[a-z]+\b", t))
    return sorted(n for n, c in counts.items() if c >= 20 and lower[n.lower()] < c // 4)


def categories(texts: list[str], per_category: int, seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """(stored, query) pairs per category, at most `per_category` each, from distinct QQP questions."""
    rng = random.Random(seed)
    makers: dict[str, Callable[[str], str | None]] = {
        "opposites": _word_swap(OPPOSITES), "order swaps": _order_swap, "moved negation": _moved_negation,
        "numbers": _number, "names": _name_swap(_frequent_names(texts), rng),
        "different entity": _word_swap(ENTITIES)}
    shuffled = list(texts)
    rng.shuffle(shuffled)
    out = {}
    for name, make in makers.items():
        pairs = [(t, q) for t in shuffled if (q := make(t)) is not None and q != t]
        out[name] = pairs[:per_category]
    return out
