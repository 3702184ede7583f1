"""Post-check for semantic hits: embeddings place "2 apples" near "3 apples" and "is X safe" near "is X not
safe", which is the false hit users complain about most. Two texts may share an answer only if they agree on
their numbers, code, negations and names; the embedding decides only between texts that pass this check."""
from __future__ import annotations

import re
from dataclasses import dataclass

_CODE_SPAN = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# Identifiers with dots/underscores, calls, brackets and operators: how code shows outside backticks.
_CODEISH = re.compile(r"[A-Za-z_]\w*(?:[._]\w+)+|\w+\([^)]*\)|\w*\[[^\]]*\]|[=<>!+\-*/%&|^]{2,}|[<>=]")
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")
_SENTENCE_END = re.compile(r"[.!?]\s*$")
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())} | {
    "thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000", "million": "1e6",
    "billion": "1e9", "first": "1", "second": "2", "third": "3", "half": "0.5", "double": "2x", "twice": "2x"}
_NEGATIONS = {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "nowhere", "without",
              "cannot", "dont", "doesnt", "isnt", "cant", "wont",
              "false", "untrue", "incorrect", "unsafe"}  # "unsafe" and "not safe" count alike


@dataclass(frozen=True)
class Signature:
    numbers: tuple[str, ...]
    code: frozenset[str]
    negations: int
    names: frozenset[str]  # lower-cased capitalised words that do not start a sentence
    words: frozenset[str]  # every lower-cased word, to look names up case-insensitively


def signature(text: str) -> Signature:
    spans = [" ".join(s.strip("`").split()) for s in _CODE_SPAN.findall(text)]
    prose = _CODE_SPAN.sub(" ", text)
    words = _WORD.findall(prose)
    lowered = [w.lower().replace("’", "'") for w in words]
    numbers = [n.replace(",", "") for n in _NUMBER.findall(prose)] + [
        _NUMBER_WORDS[w] for w in lowered if w in _NUMBER_WORDS]
    negations = sum(1 for w in lowered if w.replace("'", "") in _NEGATIONS or w.endswith("n't"))
    return Signature(tuple(sorted(numbers)), frozenset(spans + _CODEISH.findall(prose)), negations,
                     frozenset(_names(prose)), frozenset(lowered))


def _names(prose: str) -> list[str]:
    names = []
    for match in _WORD.finditer(prose):
        word, before = match.group(), prose[:match.start()].rstrip()
        starts_sentence = not before or _SENTENCE_END.search(before) is not None or before.endswith(("\n", ":"))
        if word[0].isupper() and word != "I" and not starts_sentence:
            names.append(word.lower())
    return names


def compatible(a: Signature, b: Signature) -> bool:
    """Equal numbers, code and negation count; every name of each text appears (any case) in the other."""
    return (a.numbers == b.numbers and a.code == b.code and a.negations == b.negations
            and a.names <= b.words and b.names <= a.words)
