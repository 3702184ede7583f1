"""Word pairs that flip what a question asks for, written for Velo's semantic cache (bench/semantic_quality.py
measures how often an embedding puts such questions above the threshold: 52% of one-word opposites at 0.95), and
the verifier's check for them. Inflections are matched by `reading.stem`, so each pair is listed once, in its
plainest form. Prefix opposites (legal/illegal, like/dislike, possible/impossible) and -ful/-less are found by
rule, not listed."""
from __future__ import annotations

import functools
from collections import Counter

from .reading import Reading

_PAIRS = """
increase decrease, rise fall, raise lower, grow shrink, gain lose, gain loss, win lose, win loss, add remove,
add subtract, plus minus, multiply divide, maximum minimum, max min, maximize minimize, most least, more less,
more fewer, many few, big small, large small, bigger smaller, long short, tall short, high low, higher lower,
wide narrow, thick thin, heavy light, fat thin, deep shallow, fast slow, faster slower, quick slow, early late,
earlier later, before after, first last, begin end, start end, start stop, start finish, open close, enter exit,
entry exit, arrive leave, arrive depart, come go, push pull, up down, upload download, upstream downstream,
upper lower, uppercase lowercase, top bottom, above below, over under, inside outside, internal external,
inner outer, in out, input output, inbound outbound, import export, incoming outgoing, send receive,
sender receiver, buy sell, buyer seller, lend borrow, lender borrower, give take, giving taking, import export,
encode decode, encoder decoder, encrypt decrypt, compress decompress, zip unzip, serialize deserialize,
include exclude, inclusive exclusive, accept reject, allow deny, allow block, allow forbid, permit forbid,
enable disable, on off, activate deactivate, install uninstall, mount unmount, lock unlock, block unblock,
follow unfollow, subscribe unsubscribe, connect disconnect, attach detach, load unload, pack unpack,
wrap unwrap, do undo, redo undo, show hide, visible hidden, public private, local remote, local global,
client server, frontend backend, front back, forward backward, forwards backwards, ascending descending,
ascend descend, asc desc, left right, east west, north south, horizontal vertical, row column, rows columns,
width height, min max, true false, yes no, positive negative, plus minus, pro con, pros cons,
advantage disadvantage, benefit drawback, good bad, better worse, best worst, right wrong, correct incorrect,
success failure, succeed fail, pass fail, strong weak, strength weakness, hard soft, hard easy, difficult easy,
simple complex, cheap expensive, rich poor, wealth poverty, happy sad, happiness sadness, love hate, like hate,
friend enemy, hot cold, warm cool, heat cold, summer winter, spring autumn, day night, morning evening,
sunrise sunset, light dark, black white, wet dry, full empty, old new, old young, young old, ancient modern,
past future,male female, man woman, men women, boy girl, boys girls, husband wife, boyfriend girlfriend,
father mother, son daughter, brother sister, king queen, mr mrs, he she, his her, him her, masculine feminine,
alive dead, live die, life death, birth death, born die, war peace, attack defend, offense defense,
offensive defensive, buy rent, rent own, employer employee, teacher student, parent child, doctor patient,
predator prey, master slave, owner tenant, landlord tenant, host guest, leader follower, major minor,
majority minority, senior junior, junior senior, superior inferior, import export, sync async, synchronous
asynchronous, static dynamic, mutable immutable, stateful stateless, compile decompile, compiled interpreted,
encode decode, read write, reader writer, readable writable, get set, getter setter, push pop, enqueue dequeue,
head tail, prefix suffix, prepend append, leading trailing, before after, previous next, prev next,
ancestor descendant, parent child, superclass subclass, superset subset, union intersection, merge split,
join split, combine separate, together apart, same different, similar different, equal unequal, agree disagree,
always never, everything nothing, everyone nobody, all none, any none, some none, all some, every some,
since until, before during, after during, before while, after while,
legal illegal, valid invalid, safe dangerous, safe unsafe, healthy unhealthy, clean dirty, pure impure,
sweet sour, sweet bitter, asleep awake, sleep wake, present absent, arrival departure, question answer,
ask answer, cause effect, input output, source target, source destination, origin destination, sender recipient,
debit credit, profit loss, income expense, revenue cost, asset liability, bull bear, bullish bearish,
optimist pessimist, optimistic pessimistic, introvert extrovert, innocent guilty, win defeat, victory defeat,
liberal conservative, left-wing right-wing, democrat republican, capitalism socialism, theist atheist,
believer atheist, natural artificial, organic inorganic, real fake, genuine fake, true fake, fact fiction,
fiction nonfiction, formal informal, official unofficial, literal figurative, abstract concrete,
theory practice, theoretical practical, manual automatic, online offline, wired wireless, analog digital,
acid base, acidic alkaline, positive negative, anode cathode, proton electron, import export, freeze melt,
frozen melted, solid liquid, expand contract, expansion contraction, inflation deflation, inhale exhale,
appear disappear, remember forget, found lost, find lose, catch throw, throw catch, attack retreat,
advance retreat, upgrade downgrade, promote demote, promotion demotion, hire fire, employ unemploy,
marry divorce, married single, wedding divorce, together alone, include omit, keep discard, save delete,
create destroy, create delete, build destroy, construct demolish, insert delete, append remove, 
to from, into out, towards away, toward away, with without, for against, pro anti, support oppose, favor oppose
"""


def _table() -> dict[str, frozenset[str]]:
    pairs: dict[str, set[str]] = {}
    for item in _PAIRS.replace("\n", " ").split(","):
        words = item.split()
        if not words:
            continue
        a, b = words
        pairs.setdefault(a, set()).add(b)
        pairs.setdefault(b, set()).add(a)
    return {w: frozenset(o) for w, o in pairs.items()}


OPPOSITES = _table()
_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non", "non-", "de", "anti")  # "illegal", "dislike", "nonzero"


def opposite(a: Reading, b: Reading) -> bool:
    """A word more often in one text whose opposite is more often in the other (stopwords count: "up"/"down")."""
    only_a, only_b = Counter(a.stems), Counter(b.stems)
    only_a.subtract(b.stems)
    only_b.subtract(a.stems)
    xs = {w for w, n in only_a.items() if n > 0} | {t for t, s in zip(a.tokens, a.stems) if only_a[s] > 0}
    ys = {w for w, n in only_b.items() if n > 0} | {t for t, s in zip(b.tokens, b.stems) if only_b[s] > 0}
    return any(_is_opposite(x, y) for x in xs for y in ys)


def _is_opposite(x: str, y: str) -> bool:
    """Listed as opposites (in any degree), or one is the other with a negating prefix, or -ful against -less."""
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
