"""Texts that say the same thing but for words put in or put in place of others: "cook rice" / "cook pasta" (another
entity), "<a pasted report> summarize it" / "<the same report> list its typos" (another instruction), "... Answer in
one word." put after the same question (another answer). The embedding already put the two texts above the
threshold, so everything else about them agrees: what differs is few words against many shared, and weighs little
in the vector while it changes the answer."""
from __future__ import annotations

from .reading import Reading

_MODIFIERS = frozenset("fast quick easy simple great nice cool new real whole proper right".split())
# -ly words that say how often, which changes the answer ("take it daily" / "take it monthly"), not how
_FREQUENCIES = frozenset("hourly daily nightly weekly biweekly fortnightly monthly quarterly yearly annually usually "
                         "rarely frequently occasionally normally generally typically commonly regularly "
                         "constantly".split())
# What a word's form may add to it, after `stem` and `form` have taken off what they do ("meditat" + "ion")
_ENDINGS = frozenset("s es e d ed ing er ers or ors est ly ily y ies al ally ic ical ment ments ement ness ion ions "
                     "ation ations ition ize ise ity ive iv ful less able ible ism ist ists ian ish ent ence ant ance "
                     "ship th ag age ure ture ous ious".split())


def one_word_replaced(a: Reading, b: Reading) -> bool:
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


def words_added(a: Reading, b: Reading) -> bool:
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


def run_replaced(a: Reading, b: Reading) -> bool:
    """The texts share a start and an end of content words, three times as many as the longer of the runs between
    them that differ, two or more words in one of them: the same passage followed by another instruction. The
    passage's words outweigh the instruction's in the embedding: "<a pasted report> summarize the text above" was
    served the answer to "<the same report> list the spelling mistakes in the text above" (cosine 0.980). One word
    for one is `one_word_replaced`'s; modifiers for modifiers ("quickly and easily" / "fast") still agree."""
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
        return False  # the same words in another order (`word_order.swapped`'s), or a compound written apart
    return not all(_modifier(r.tokens[r.where[i]]) for r, run in ((a, run_a), (b, run_b)) for i in run)


def _modifier(word: str) -> bool:
    """Adverbs and gradable adjectives change how, not what: "learn Python quickly" / "learn Python fast". Only one
    modifier for another: one replaced by a word that is none ("in a simple way" / "in a detailed way") asks
    another thing."""
    return word.endswith(("ly", "est")) and word not in _FREQUENCIES or word in _MODIFIERS
