"""One text read once for the verifier: its tokens, their stems, its content words in order and its clauses.

Reading is the costly half of a check (~50 us a question), so it is done once per text, on the encoder's thread;
the checks (verifier.py and the modules it calls) only compare two readings. The word lists here say what a token
is (a stop word, a negation, a clause break) and are shared by every check that asks."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .guard import OPEN_QUESTION, Signature, reads_as_number, signature

_WORD = re.compile(r"[^\W_]+(?:['’][^\W\d_]+)?|[?!.;,:]")
STOP = frozenset("""a an the and or but if of in on at to for from by with about as into onto is are was were be
been being am do does did doing have has had having can could will would should shall may might must i me my mine
myself you your yours yourself he him his she her hers it its we us our ours they them their theirs this that these
those there here what which who whom whose why how when where whether than then so too very just also any some
each every all both either one ones get got getting make made really actually much many such own other another
s t way ways thing things someone something anyone anything people person best good more less most least""".split())
_NEGATION = frozenset("not no never none nobody nothing neither nor nowhere without cannot".split())
_NEGATED_SPELLINGS = frozenset("dont doesnt cant wont isnt arent didnt shouldnt wouldnt couldnt".split())
_CLAUSE_BREAK = frozenset("? ! . ; , when if because while although though but yet unless whereas since until "
                          "after before so that".split())
_POSSESSIVE = re.compile(r"'s?$")
_SUFFIXES = (("ational", "ate"), ("ization", "ize"), ("ies", "y"), ("ied", "y"), ("ing", ""), ("ed", ""),
             ("sses", "ss"), ("ches", "ch"), ("shes", "sh"), ("xes", "x"), ("ly", ""), ("s", ""))


@dataclass(frozen=True)
class Reading:
    """What the checks need of one text: its guard signature, every token and its stem, the content-word stems in
    order (with the index of the token each came from), and which clauses hold a negation."""

    signature: Signature
    tokens: tuple[str, ...]
    stems: tuple[str, ...]
    content: tuple[str, ...]
    where: tuple[int, ...]  # content[i] is form(stems[where[i]])
    clauses: tuple[tuple[frozenset[str], bool], ...]  # (content stems of the clause, has a negation)
    openers: tuple[str, ...]  # the word that opened each clause ("when", "if"); "" at the start or after punctuation


@functools.lru_cache(maxsize=1 << 16)  # a question's words come back often: read() at half the cost
def stem(word: str) -> str:
    """A light suffix strip, enough to match "increases"/"increase", "studying"/"study": no lexicon needed."""
    for suffix, repl in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: len(word) - len(suffix)] + repl
    return word


@functools.lru_cache(maxsize=1 << 16)
def form(stemmed: str) -> str:
    """A content word as the texts are aligned by: without a silent e, which its -ing and -ed forms drop ("take",
    "taking": tak; "use", "using", "used": use). Apart, "should she stop taking" read as "take" replaced by "stop" and
    "tak" put in, no run of words added, and was served the answer to "should she take"."""
    if len(stemmed) >= 4 and stemmed.endswith("e"):
        return stemmed[:-1]
    for ending in ("ing", "ed"):
        root = stemmed[:-len(ending)]
        if stemmed.endswith(ending) and len(root) == 2 and root[0] in "aeiou" and root[1] not in "aeiouy":
            return root + "e"
    return stemmed


def read(text: str) -> Reading:
    """Everything the checks compare, made in one pass over the text's tokens."""
    spelt = tuple(t.lower().replace("’", "'") for t in _WORD.findall(OPEN_QUESTION.sub(" ", text)))
    tokens = tuple(_POSSESSIVE.sub("", t) for t in spelt)
    stems = tuple(stem(t) for t in tokens)
    content, where = [], []
    clauses, clause, negated, openers, opener = [], set(), False, [], ""
    for i, tok in enumerate(tokens):
        if tok in _CLAUSE_BREAK:
            if clause or negated:
                clauses.append((frozenset(clause), negated))
                openers.append(opener)
            clause, negated, opener = set(), False, tok if tok.isalpha() else ""
        elif tok in _NEGATION or tok.endswith("n't") or tok in _NEGATED_SPELLINGS:
            negated = True
        elif tok.isalnum() and (tok not in STOP or _counts(spelt, i)):
            content.append(word := form(stems[i]))
            where.append(i)
            clause.add(word)
    if clause or negated:
        clauses.append((frozenset(clause), negated))
        openers.append(opener)
    return Reading(signature(text), tokens, stems, tuple(content), tuple(where), tuple(clauses), tuple(openers))


def _counts(spelt: tuple[str, ...], i: int) -> bool:
    """Whether spelt[i], a stop word as written (its "'s" kept), is a number the guard counts ("one" of "count from
    one to ten", not of "how does one" or "one's"): a content word then, whose place the order checks read. Left out,
    "count from ten to one" was served the answer to "count from one to ten" (the guard compares numbers sorted)."""
    return reads_as_number(spelt[i], spelt[i - 1] if i else "", spelt[i + 1] if i + 1 < len(spelt) else "")
