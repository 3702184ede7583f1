"""Second look at a semantic candidate before it is served: does the stored question ask what the query asks?

An embedding reads a question as a bag of meaning, so it scores "rows to columns" against "columns to rows" at
~0.99, "increase" against "decrease" at ~0.97, and does not see a negation move from one clause to another.
The guard (guard.py) already refuses texts whose numbers, names, code or count of negations differ. This module
adds six checks on the words of both texts, aligned in order:
- opposites: a word of one text whose opposite (opposites.py, or an un-/in-/dis-/non- prefix, -ful/-less)
  stands in the other in its place;
- swapped roles: two words shared by both texts whose order flips across a directional word ("to", "than",
  "from") or across a third shared word that stays between them ("Python beats Java" / "Java beats Python"), or
  a pronoun of the asker's in one where the other has a third person's ("can he evict me" / "can I evict him"),
  or the same pronouns with their roles traded ("should I pay them" / "should they pay me"), or who did it against
  whom it was done to ("who killed Caesar" / "who did Caesar kill"; "did Brutus kill Caesar" / "was Brutus killed
  by Caesar"), or clauses that traded their words or their "when" ("why am I tired when I wake up" / "why do I wake
  up when I am tired");
- moved negation: a negation that sits in another clause in the other text;
- tense: what happened in one where the other asks what will ("why did it fall" / "why will it fall"), and
  what one may do where the other asks what one must ("can I eat sushi" / "must I eat sushi");
- one word replaced: the texts align word for word but for one content word that is not a form of the other
  ("cook rice" / "cook pasta"): a different entity. The embedding already put the two texts above the
  threshold, so everything else about them agrees. Or a run of words in place of another between the same start
  and end, three times as long as the run at least ("<a pasted report> summarize it" / "<the same report> list
  its typos");
- words added: one text is the other with a run of content words put in, an instruction or a condition added to
  the same question ("... Answer in one word.", "Explain briefly ...", "... step by step"): another answer.
Measured against a small NLI cross-encoder and the embedding of the differing words in bench/semantic_quality.py.

`read` does the text work once per text, on the encoder's thread; `agrees` compares two readings (a few
microseconds of set operations), so a candidate costs nothing more off the event loop than the guard did.
"""
from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass
from collections import Counter

from .guard import OPEN_QUESTION, Signature, compatible, signature
from .opposites import OPPOSITES

_WORD = re.compile(r"[^\W_]+(?:['’][^\W\d_]+)?|[?!.;,:]")
_STOP = frozenset("""a an the and or but if of in on at to for from by with about as into onto is are was were be
been being am do does did doing have has had having can could will would should shall may might must i me my mine
myself you your yours yourself he him his she her hers it its we us our ours they them their theirs this that these
those there here what which who whom whose why how when where whether than then so too very just also any some
each every all both either one ones get got getting make made really actually much many such own other another
s t way ways thing things someone something anyone anything people person best good more less most least""".split())
_NEGATION = frozenset("not no never none nobody nothing neither nor nowhere without cannot".split())
_DIRECTIONAL = frozenset("to in into onto from than toward towards over before after above below under versus "
                         "beats beat vs".split()) - {"vs", "versus"}
# Whose: the asker's side (I, you, we: paraphrases trade these freely) and a third person's
_ASKER = frozenset("i me my mine myself you your yours yourself yourselves we us our ours ourselves".split())
_THIRD = frozenset("he him his himself she her hers herself".split())
_ACTING, _ACTED_ON = frozenset(["i", "we"]), frozenset(["me", "us"])  # the asker's side ("you" is either)
# What happened and what will: auxiliaries, stop words to the other checks
_PAST = frozenset("did was were had".split())
_FUTURE = frozenset("will shall".split())
# What one may do and what one must (not "should", which paraphrases trade for "can": "what can/should I do")
_MAY = frozenset("can could may might".split())
_MUST = frozenset(["must"])
_DO = frozenset("did does do".split())
_BE = frozenset("is are was were be been being get gets got".split())
_THEY = frozenset("they them their theirs themselves".split())  # a third person, or people in general
_CLAUSE_BREAK = frozenset("? ! . ; , when if because while although though but yet unless whereas since until "
                          "after before so that".split())
_MODIFIERS = frozenset("fast quick easy simple great nice cool new real whole proper right".split())
# -ly words that say how often, which changes the answer ("take it daily" / "take it monthly"), not how
_FREQUENCIES = frozenset("hourly daily nightly weekly biweekly fortnightly monthly quarterly yearly annually usually "
                         "rarely frequently occasionally normally generally typically commonly regularly "
                         "constantly".split())
# What a word's form may add to it, after `stem` and `_form` have taken off what they do ("meditat" + "ion")
_ENDINGS = frozenset("s es e d ed ing er ers or ors est ly ily y ies al ally ic ical ment ments ement ness ion ions "
                     "ation ations ition ize ise ity ive iv ful less able ible ism ist ists ian ish ent ence ant ance "
                     "ship th ag age ure ture ous ious".split())
# Prepositions: what they stand between plays a part in a relation ("replace tabs with spaces"), so two words that
# trade places across one trade parts; "and", "or", articles and the like join or mark things either way round
_RELATIONS = _DIRECTIONAL | frozenset("with without within of by for per on at as via about against among through "
                                      "across upon".split())
_PIVOT_SPAN = 6  # tokens from one swapped word to the other: wider, it is clauses that moved, not roles
_NEGATED_SPELLINGS = frozenset("dont doesnt cant wont isnt arent didnt shouldnt wouldnt couldnt".split())
_POSSESSIVE = re.compile(r"'s?$")
_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non", "non-", "de", "anti")
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
    where: tuple[int, ...]  # content[i] is _form(stems[where[i]])
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
def _form(stem: str) -> str:
    """A content word as the texts are aligned by: without a silent e, which its -ing and -ed forms drop ("take",
    "taking": tak; "use", "using", "used": use). Apart, "should she stop taking" read as "take" replaced by "stop" and
    "tak" put in, no run of words added, and was served the answer to "should she take"."""
    if len(stem) >= 4 and stem.endswith("e"):
        return stem[:-1]
    for ending in ("ing", "ed"):
        root = stem[:-len(ending)]
        if stem.endswith(ending) and len(root) == 2 and root[0] in "aeiou" and root[1] not in "aeiouy":
            return root + "e"
    return stem


def read(text: str) -> Reading:
    tokens = tuple(_POSSESSIVE.sub("", t.lower().replace("’", "'"))
                   for t in _WORD.findall(OPEN_QUESTION.sub(" ", text)))
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
        elif tok not in _STOP and tok.isalnum():
            content.append(form := _form(stems[i]))
            where.append(i)
            clause.add(form)
    if clause or negated:
        clauses.append((frozenset(clause), negated))
        openers.append(opener)
    return Reading(signature(text), tokens, stems, tuple(content), tuple(where), tuple(clauses), tuple(openers))


def agrees(a: Reading, b: Reading) -> bool:
    return disagreement(a, b) is None


def disagreement(a: Reading, b: Reading) -> str | None:
    """The first reason the two texts need different answers, or None."""
    if not compatible(a.signature, b.signature):
        return "guard"
    if a.tokens == b.tokens:
        return None
    if _opposite(a, b):
        return "opposite"
    if _swapped(a, b) or _swapped(b, a) or _directions(a) != _directions(b) and _reversed(a, b) \
            or _other_person(a, b) or _doer_and_done_to(a, b) or _clauses_traded(a, b):
        return "swapped"
    if _moved_negation(a, b) or _moved_negation(b, a):
        return "negation"
    if _aligned_swap(a, b, _PAST, _FUTURE):
        return "tense"
    if _aligned_swap(a, b, _MAY, _MUST):
        return "modal"
    if _one_word_replaced(a, b):
        return "replaced"
    if _words_added(a, b):
        return "added"
    if _run_replaced(a, b):
        return "replaced"
    return None


def _is_opposite(x: str, y: str) -> bool:
    if any(b in OPPOSITES.get(a, ()) for a in _plain_degree(x) for b in _plain_degree(y)):
        return True
    for p in _PREFIXES:
        if (y == p + x or x == p + y) and min(len(x), len(y)) >= 4:
            return True
    return x.endswith("ful") and y == x[:-3] + "less" or y.endswith("ful") and x == y[:-3] + "less"


@functools.lru_cache(maxsize=1 << 16)
def _plain_degree(word: str) -> tuple[str, ...]:
    """The word, and what it may be the comparative or superlative of ("fastest" fast, "largest" large, "hottest"
    hot, "earliest" early), for the pairs listed in their plainest form: "fastest" and "slowest" were no opposites
    to the stemmer, and a question's -est word swapped for its opposite was served the other's answer."""
    for ending in ("est", "er"):
        root = word[:-len(ending)]
        if word.endswith(ending) and len(root) >= 2:
            undoubled = (root[:-1],) if len(root) > 2 and root[-1] == root[-2] else ()
            return (word, root, root + "e", *undoubled, *((root[:-1] + "y",) if root.endswith("i") else ()))
    return (word,)


def _opposite(a: Reading, b: Reading) -> bool:
    """A word more often in one text whose opposite is more often in the other (stopwords count: "up"/"down")."""
    only_a, only_b = Counter(a.stems), Counter(b.stems)
    only_a.subtract(b.stems)
    only_b.subtract(a.stems)
    xs = {w for w, n in only_a.items() if n > 0} | {t for t, s in zip(a.tokens, a.stems) if only_a[s] > 0}
    ys = {w for w, n in only_b.items() if n > 0} | {t for t, s in zip(b.tokens, b.stems) if only_b[s] > 0}
    return any(_is_opposite(x, y) for x in xs for y in ys)


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


def _other_person(a: Reading, b: Reading) -> bool:
    """Texts alike word for word but where one has the asker (I, my, you) the other has a third person (he, her):
    pronouns are stop words to the other checks, so "... can he evict me?" was served the answer to "... can I evict
    him?" (cosine 0.979), "what are his rights?" the one to "what are my rights?". Or the same pronouns with their
    roles traded: "should they pay me" was served the answer to "should I pay them" (0.981). Or the asker acting in
    one and acted on in the other (`_asker_turned`)."""
    if _aligned_swap(a, b, _ASKER, _THIRD) or _asker_turned(a, b):
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


def _doer_and_done_to(a: Reading, b: Reading) -> bool:
    """Whether one text asks who did it and the other whom it was done to, or one is active and the other passive
    with its agent, over the same words (`_asks_object`, `_asks_subject`, `_by_agent`)."""
    return _asks_object(a) != _asks_object(b) and _asks_subject(a) != _asks_subject(b) \
        or _by_agent(a) != _by_agent(b) and Counter(a.content) == Counter(b.content)


def _clauses_traded(a: Reading, b: Reading) -> bool:
    """The same content words in clauses that traded what they hold (`_words_traded`) or how they are joined
    (`_opener_moved`): "what time is it in new york when it is noon in london?" was served the answer to "what time
    is it in london when it is noon in new york?" (cosine 0.986), "why do I feel tired when I wake up early?" the one
    to "why do I wake up early when I feel tired?" (0.975): words too far apart for `_swapped`."""
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


def _clause_of(r: Reading) -> dict[str, int]:
    """Each content word that is in one clause only -> that clause's place."""
    seen: dict[str, int] = {}
    for place, (words, _) in enumerate(r.clauses):
        for word in words:
            seen[word] = -1 if word in seen else place
    return {w: place for w, place in seen.items() if place >= 0}


def _asks_object(r: Reading) -> bool:
    """Whether it asks whom something was done to ("who did Caesar kill"): "who" then do-support."""
    return any(t == "who" and nxt in _DO for t, nxt in zip(r.tokens, r.tokens[1:]))


def _asks_subject(r: Reading) -> bool:
    """Whether it asks who did something ("who killed Caesar"): "who" then a content word, its verb. With the other
    text asking whom (`_asks_object`), the same words ask the other side: "who did Caesar kill?" was served the
    answer to "who killed Caesar?" (cosine 0.978, after a preamble)."""
    return any(t == "who" and nxt.isalpha() and nxt not in _STOP for t, nxt in zip(r.tokens, r.tokens[1:]))


def _by_agent(r: Reading) -> bool:
    """Whether it is passive with its agent ("was Brutus killed by Caesar"): "by" after a participle, a form of "be"
    before. With the same words active in the other text, the roles are the other way round: "did Brutus kill
    Caesar?" and "was Brutus killed by Caesar?" (cosine 0.981) shared an answer."""
    t = r.tokens
    return any(w == "by" and i and t[i - 1].endswith(("ed", "en")) and not _BE.isdisjoint(t[:i])
               for i, w in enumerate(t))


def _aligned_swap(a: Reading, b: Reading, these: frozenset[str], those: frozenset[str]) -> bool:
    """Texts alike in length where one has a word of `these` in the place the other has one of `those`: "why did
    tech stocks fall?" was served the answer to "why will tech stocks fall?" (cosine 0.960, after a preamble)."""
    return len(a.tokens) == len(b.tokens) and any(
        x in these and y in those or x in those and y in these for x, y in zip(a.tokens, b.tokens))


def _roles(r: Reading) -> list[bool]:
    """Whose each pronoun is, in order: True for the asker's (I, you, we), False for a third person's."""
    return [t in _ASKER for t in r.tokens if t in _ASKER or t in _THIRD or t in _THEY]


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


def _swapped(a: Reading, b: Reading) -> bool:
    """Two nearby shared words in one order in `a` and the other in `b`, across a shared word that stays between
    them in both ("does a dog chase a cat" / "does a cat chase a dog"), or a preposition ("replace tabs with spaces"
    / "replace spaces with tabs", "merge the feature branch into main" / "merge main into the feature branch": cosine
    0.991 and 0.984; `_reversed` reads only the words next to a directional one)."""
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


def _moved_negation(a: Reading, b: Reading) -> bool:
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


def _one_word_replaced(a: Reading, b: Reading) -> bool:
    """The content words align one for one but for a single word that is no form of the other."""
    if len(a.content) != len(b.content) or len(a.content) < 2:
        return False
    differ = [(x, y) for x, y in zip(a.content, b.content) if x != y]
    if len(differ) != 1:
        return False
    x, y = differ[0]
    if _forms_of_one_word(x, y):
        return False
    i = a.content.index(x)
    return not (_modifier(a.tokens[a.where[i]]) and _modifier(b.tokens[b.where[i]]))


def _forms_of_one_word(x: str, y: str) -> bool:
    """Whether two words that differ are forms of one (or one a typo of the other): they start alike, and where one
    is the other with letters put on, those are an ending. Another name may start with a whole name: "swiftui" and
    "swift", "vuex" and "vue", "javascript" and "java", "nigeria" and "niger" were one word, and a question about one
    was served the answer about the other. Otherwise they differ in their last two letters at most ("decid",
    "decision"), or by one letter after their first four ("favourite", "favorite"): words that only start alike are
    two, "innerHTML" and "innerText" were one word, and "should I set innerText …" was served the answer to "should I
    set innerHTML …" (cosine 0.967, after a preamble)."""
    short, long = sorted((x, y), key=len)
    if long.startswith(short):
        put_on = long[len(short):]
        if len(put_on) == 1 and len(short) >= 5:  # a typo at its end, or "learnt": not "vue" and "vuex"
            return True
        return put_on.removeprefix(short[-1]) in _ENDINGS | {""}  # a consonant doubled: "programm", "program"
    return long.startswith(short[:max(4, len(short) - 2)]) or long.startswith(short[:4]) and _one_letter_apart(
        short, long)


def _one_letter_apart(short: str, long: str) -> bool:
    """One letter left out, put in or changed: a typo or another spelling of the word."""
    i = next((i for i, (x, y) in enumerate(zip(short, long)) if x != y), len(short))
    return short[i + (len(short) == len(long)):] == long[i + 1:]


def _words_added(a: Reading, b: Reading) -> bool:
    """One text's content words are the other's with a run of more put in, anywhere: an instruction, a condition or a
    second question added to the same one. An embedding barely moves for them (0.98-0.99 for "Respond only with yes
    or no." after a 25-word question, or "Explain briefly how ..."), and the question's answer alone was served."""
    fewer, more = sorted((a.content, b.content), key=len)
    if len(more) == len(fewer):
        return False
    # the run fits between what both start with and what both end with: linear, where a slice per place was
    # quadratic (an agent's 2,000-word turn compared on the event loop)
    start = next((i for i, (x, y) in enumerate(zip(fewer, more)) if x != y), len(fewer))
    end = next((i for i, (x, y) in enumerate(zip(reversed(fewer), reversed(more))) if x != y), len(fewer))
    return start + end >= len(fewer)


def _run_replaced(a: Reading, b: Reading) -> bool:
    """The texts share a start and an end of content words, three times as many as the longer of the runs between
    them that differ, two or more words in one of them: the same passage followed by another instruction. The
    passage's words outweigh the instruction's in the embedding: "<a pasted report> summarize the text above" was
    served the answer to "<the same report> list the spelling mistakes in the text above" (cosine 0.980). One word
    for one is `_one_word_replaced`'s; modifiers for modifiers ("quickly and easily" / "fast") still agree."""
    start = next((i for i, (x, y) in enumerate(zip(a.content, b.content)) if x != y), None)
    if start is None:
        return False
    room = min(len(a.content), len(b.content)) - start
    end = next((i for i, (x, y) in enumerate(zip(reversed(a.content), reversed(b.content))) if x != y or i == room),
               room)
    run_a, run_b = range(start, len(a.content) - end), range(start, len(b.content) - end)
    longest = max(len(run_a), len(run_b))
    if not (run_a and run_b) or longest < 2 or start + end < 3 * longest:
        return False
    words_a, words_b = [a.content[i] for i in run_a], [b.content[i] for i in run_b]
    if sorted(words_a) == sorted(words_b) or "".join(words_a) == "".join(words_b):
        return False  # the same words in another order (`_swapped`'s), or a compound written apart ("quick sort")
    return not all(_modifier(r.tokens[r.where[i]]) for r, run in ((a, run_a), (b, run_b)) for i in run)


def _modifier(word: str) -> bool:
    """Adverbs and gradable adjectives change how, not what: "learn Python quickly" / "learn Python fast". Only one
    modifier for another: one replaced by a word that is none ("in a simple way" / "in a detailed way") asks
    another thing."""
    return word.endswith(("ly", "est")) and word not in _FREQUENCIES or word in _MODIFIERS
