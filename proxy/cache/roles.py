"""Who acts and who is acted on, told by the words around the same content words: pronouns ("can he evict me" /
"can I evict him") and grammar ("who killed Caesar" / "who did Caesar kill", active / passive with its agent).
Pronouns and auxiliaries are stop words to the other checks, so texts that differ only here look alike to them."""
from __future__ import annotations

from collections import Counter

from .aligned import aligned_swap
from .reading import STOP, Reading

# Whose: the asker's side (I, you, we: paraphrases trade these freely) and a third person's
_ASKER = frozenset("i me my mine myself you your yours yourself yourselves we us our ours ourselves".split())
_THIRD = frozenset("he him his himself she her hers herself".split())
_THEY = frozenset("they them their theirs themselves".split())  # a third person, or people in general
_ACTING, _ACTED_ON = frozenset(["i", "we"]), frozenset(["me", "us"])  # the asker's side ("you" is either)
_DO = frozenset("did does do".split())
_BE = frozenset("is are was were be been being get gets got".split())


def other_person(a: Reading, b: Reading) -> bool:
    """Texts alike word for word but where one has the asker (I, my, you) the other has a third person (he, her):
    pronouns are stop words to the other checks, so "... can he evict me?" was served the answer to "... can I evict
    him?" (cosine 0.979), "what are his rights?" the one to "what are my rights?". Or the same pronouns with their
    roles traded: "should they pay me" was served the answer to "should I pay them" (0.981). Or the asker acting in
    one and acted on in the other (`_asker_turned`)."""
    if aligned_swap(a, b, _ASKER, _THIRD) or _asker_turned(a, b):
        return True
    roles_a, roles_b = _roles(a), _roles(b)
    return roles_a != roles_b and sorted(roles_a) == sorted(roles_b) and len(set(roles_a)) > 1


def _asker_turned(a: Reading, b: Reading) -> bool:
    """The same words, and the asker as often in each, but acting ("I", "we") in one where acted on ("me", "us") in
    the other: "do I charge vat to customers in germany?" was served the answer to "do customers in germany charge me
    vat?" (cosine 0.974, after a preamble)."""
    cases_a, cases_b = _asker_cases(a), _asker_cases(b)
    return len(cases_a) == len(cases_b) and cases_a != cases_b and Counter(a.content) == Counter(b.content)


def _asker_cases(r: Reading) -> list[bool]:
    """Each time the asker is named as the one acting (False) or acted on (True), fewest acted on first."""
    return sorted(t in _ACTED_ON for t in r.tokens if t in _ACTING or t in _ACTED_ON)


def _roles(r: Reading) -> list[bool]:
    """Whose each pronoun is, in order: True for the asker's (I, you, we), False for a third person's."""
    return [t in _ASKER for t in r.tokens if t in _ASKER or t in _THIRD or t in _THEY]


def doer_and_done_to(a: Reading, b: Reading) -> bool:
    """Whether one text asks who did it and the other whom it was done to, or one is active and the other passive
    with its agent, over the same words (`_asks_object`, `_asks_subject`, `_by_agent`)."""
    return _asks_object(a) != _asks_object(b) and _asks_subject(a) != _asks_subject(b) \
        or _by_agent(a) != _by_agent(b) and Counter(a.content) == Counter(b.content)


def _asks_object(r: Reading) -> bool:
    """Whether it asks whom something was done to ("who did Caesar kill"): "who" then do-support."""
    return any(t == "who" and nxt in _DO for t, nxt in zip(r.tokens, r.tokens[1:]))


def _asks_subject(r: Reading) -> bool:
    """Whether it asks who did something ("who killed Caesar"): "who" then a content word, its verb. With the other
    text asking whom (`_asks_object`), the same words ask the other side: "who did Caesar kill?" was served the
    answer to "who killed Caesar?" (cosine 0.978, after a preamble)."""
    return any(t == "who" and nxt.isalpha() and nxt not in STOP for t, nxt in zip(r.tokens, r.tokens[1:]))


def _by_agent(r: Reading) -> bool:
    """Whether it is passive with its agent ("was Brutus killed by Caesar"): "by" after a participle, a form of "be"
    before. With the same words active in the other text, the roles are the other way round: "did Brutus kill
    Caesar?" and "was Brutus killed by Caesar?" (cosine 0.981) shared an answer."""
    t = r.tokens
    return any(w == "by" and i and t[i - 1].endswith(("ed", "en")) and not _BE.isdisjoint(t[:i])
               for i, w in enumerate(t))
