"""Texts alike word for word but for one small word traded at the same place: the past for the future, what one
may do for what one must. The words traded are stop words to the other checks, so only their place shows it."""
from __future__ import annotations

from .reading import Reading

# What happened and what will: auxiliaries, stop words to the other checks
_PAST = frozenset("did was were had".split())
_FUTURE = frozenset("will shall".split())
# What one may do and what one must (not "should", which paraphrases trade for "can": "what can/should I do")
_MAY = frozenset("can could may might".split())
_MUST = frozenset(["must"])


def aligned_swap(a: Reading, b: Reading, these: frozenset[str], those: frozenset[str]) -> bool:
    """Texts alike in length where one has a word of `these` in the place the other has one of `those`: "why did
    tech stocks fall?" was served the answer to "why will tech stocks fall?" (cosine 0.960, after a preamble)."""
    return len(a.tokens) == len(b.tokens) and any(
        x in these and y in those or x in those and y in these for x, y in zip(a.tokens, b.tokens))


def tense_changed(a: Reading, b: Reading) -> bool:
    """One asks what happened where the other asks what will ("why did it fall" / "why will it fall")."""
    return aligned_swap(a, b, _PAST, _FUTURE)


def modality_changed(a: Reading, b: Reading) -> bool:
    """One asks what one may do where the other asks what one must ("can I eat sushi" / "must I eat sushi")."""
    return aligned_swap(a, b, _MAY, _MUST)
