"""Post-check for semantic hits: embeddings place "2 apples" near "3 apples" and "is X safe" near "is X not
safe", which is the false hit users complain about most. Two texts may share an answer only if they agree on
their numbers, code, negations and names; the embedding decides only between texts that pass this check.

What reads as a number, a name or a negation is narrowed to what carries one: "in one go", "how does one",
"YOU" in capitals, "U.S.A." and "why or why not" did not. On 4,000 QQP duplicate pairs the guard refused 149
that share an answer because of such readings (bench/semantic_quality.py)."""
from __future__ import annotations

import functools
import re
import textwrap
import unicodedata
from dataclasses import dataclass

_CODE_SPAN = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_NUMBER = re.compile(r"(\d+(?:[.,]\d+)*)(k\b)?", re.I)
# Identifiers with dots/underscores, calls, brackets and operators: how code shows outside backticks.
_CODEISH = re.compile(r"[A-Za-z_]\w*(?:[._]\w+)+|\w+\([^)]*\)|\w*\[[^\]]*\]|[=<>!+\-*/%&|^]{2,}|[<>=]")
# Not code: abbreviations (U.S.A, i.e), a missing space after a full stop ("girlfriend.What"), web domains.
_NOT_CODE = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]?|[a-z]+\.[A-Z][a-z]*|[\w-]+\.(?:com|org|net|io|ly|in|co)")
# Numbers joined by operators: an expression, whose order and operators the sorted numbers lose ("7-3" and "3-7",
# "3/4 as a decimal" and "4/3 as a decimal" read as one question, and the embedding put them at 0.97-0.99).
_EXPRESSION = re.compile(r"\d+(?:[.,]\d+)*(?:\s*[-+*/^%×÷]\s*\d+(?:[.,]\d+)*)+")
_ABBREVIATION = re.compile(r"\b(?:[A-Za-z]\.){2,}")  # U.S. ~ US
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")
_SENTENCE_END = re.compile(r"[.!?]\s*$")
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())} | {
    "thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000", "million": "1e6",
    "billion": "1e9", "first": "1", "second": "2", "third": "3", "half": "0.5", "double": "2x", "twice": "2x"}
# "one" is a pronoun or part of an idiom after these words ("how does one", "no one", "the one", "in one go")
# and before these ("one of", "one another", "one more"); "second" is a unit after "a"/"per"; "first" is an order
# of events, not a quantity, after "at"/"the" ("at first", "the first time" ~ "for the first time").
_NOT_A_NUMBER_AFTER = {"one": {"no", "any", "some", "every", "each", "the", "which", "this", "that", "does", "can",
                               "should", "would", "will", "could", "must", "do", "did", "is", "has", "may",
                               "might", "when", "if", "go", "anyone", "in", "at", "as", "like", "every"},
                       "second": {"a", "per", "split"}, "first": {"at"}}
_NOT_A_NUMBER_BEFORE = {"one": {"of", "another", "more", "go", "day", "time", "way", "thing"}}
_NEGATIONS = {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "nowhere", "without",
              "cannot", "dont", "doesnt", "isnt", "cant", "wont",
              "false", "untrue", "incorrect", "unsafe"}  # "unsafe" and "not safe" count alike
# Negations that ask rather than deny: "is it safe or not?", "why or why not?", "whether or not".
OPEN_QUESTION = re.compile(r"\b(?:or (?:why )?not|why not|or no)\b\s*[?.!]?", re.I)
# Function words are never names, whatever their case ("What does it mean to YOU?", "books for GATE (IN)").
_FUNCTION_WORDS = set("""i i'm i've i'd i'll iam im you your yours me my mine he him his she her we our they them
their it its a an the and or but if of in on at to for from by with about as into is are was were be been am do
does did have has had can could will would should shall may might must not no what which who whom whose why how
when where this that these those there here then than so too very all any some each every more most""".split())


@dataclass(frozen=True)
class Signature:
    numbers: tuple[str, ...]
    code: frozenset[str]
    negations: int
    names: frozenset[str]  # folded capitalised words that do not start a sentence
    words: frozenset[str]  # every folded word, to look names up case-insensitively
    indents: tuple[str, ...]  # outside code spans, each line's indentation, where a line has one (else empty)


def signature(text: str) -> Signature:
    spans = [_code_lines(s) for s in _CODE_SPAN.findall(text)]
    prose = _ABBREVIATION.sub(lambda m: m.group().replace(".", ""), OPEN_QUESTION.sub(" ", _CODE_SPAN.sub(" ", text)))
    words = _WORD.findall(prose)
    lowered = [w.lower().replace("’", "'") for w in words]
    numbers = [_number(m) for m in _NUMBER.finditer(prose)] + _number_words(lowered)
    negations = sum(1 for w in lowered if w.replace("'", "") in _NEGATIONS or w.endswith("n't"))
    code = [c for c in _CODEISH.findall(prose) if not _NOT_CODE.fullmatch(c)]
    code += ["".join(e.split()) for e in _EXPRESSION.findall(prose)]
    return Signature(tuple(sorted(numbers)), frozenset(spans + code), negations, frozenset(_names(prose)),
                     frozenset(_fold(w) for w in lowered), _indents(prose))


def _code_lines(span: str) -> str:
    """A code span as a program reads it: its lines and their indentation kept, only blank lines, spaces at the lines'
    ends and the indentation all of them share dropped. Folded into one line of single spaces, a loop's body and the
    statement after it were one code ("for i in x:\n    f(i)\n    g()" / "...\ng()"), and one's answer was served
    for the other."""
    return textwrap.dedent("\n".join(line.rstrip() for line in span.strip("`").splitlines() if line.strip()))


def _indents(prose: str) -> tuple[str, ...]:
    """Each non-blank line's leading whitespace past what all of them share, where any line has some: code pasted
    without backticks, whose indentation says which lines a block holds (Python, YAML, a Makefile's tabs); () for
    text with none."""
    lines = textwrap.dedent(prose).splitlines()
    indents = tuple(line[:len(line) - len(line.lstrip())] for line in lines if line.strip())
    return indents if any(indents) else ()


def _number(m: re.Match) -> str:
    digits = m.group(1).replace(",", "")
    return str(int(float(digits) * 1000)) if m.group(2) else digits  # "20k" is 20000


def _number_words(lowered: list[str]) -> list[str]:
    return [_NUMBER_WORDS[w] for i, w in enumerate(lowered)
            if reads_as_number(w, lowered[i - 1] if i else "", lowered[i + 1] if i + 1 < len(lowered) else "")]


def reads_as_number(word: str, before: str, after: str) -> bool:
    """Whether `word` (lower case), between `before` and `after`, is a number word that counts: not "one" as a
    pronoun or in an idiom ("how does one", "one of"), nor "second" as a unit."""
    return word in _NUMBER_WORDS and before not in _NOT_A_NUMBER_AFTER.get(word, ()) \
        and after not in _NOT_A_NUMBER_BEFORE.get(word, ())


@functools.lru_cache(maxsize=1 << 16)
def _fold(word: str) -> str:
    """Case, accents, a possessive and a plural do not make another name: Pokémon ~ pokemon, Greeks ~ Greek."""
    word = unicodedata.normalize("NFKD", word.lower()).encode("ascii", "ignore").decode() or word.lower()
    word = re.sub(r"'s?$", "", word.replace("’", "'"))
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _names(prose: str) -> list[str]:
    """Capitalised words that do not start a sentence; none when capitals carry no signal (Title Case, or a
    word in capitals that is a common word: "YOU", "IN")."""
    matches = list(_WORD.finditer(prose))
    capitalised = sum(1 for m in matches if m.group()[0].isupper())
    if len(matches) >= 4 and capitalised > len(matches) * 0.6:
        return []
    names = []
    for match in matches:
        word, before = match.group(), prose[:match.start()].rstrip()
        starts_sentence = not before or _SENTENCE_END.search(before) is not None or before.endswith(("\n", ":"))
        if word[0].isupper() and word.lower() not in _FUNCTION_WORDS and not starts_sentence:
            names.append(_fold(word))
    return names


def compatible(a: Signature, b: Signature) -> bool:
    """Equal numbers, code (its indentation too) and negation count; every name of each text appears (any case) in
    the other."""
    return (a.numbers == b.numbers and a.code == b.code and a.indents == b.indents and a.negations == b.negations
            and a.names <= b.words and b.names <= a.words)
