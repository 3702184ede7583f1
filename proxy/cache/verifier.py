"""Second look at a semantic candidate before it is served: does the stored question ask what the query asks?

An embedding reads a question as a bag of meaning, so it scores "rows to columns" against "columns to rows" at
~0.99, "increase" against "decrease" at ~0.97, and does not see a negation move from one clause to another.
The guard (guard.py) already refuses texts whose numbers, names, code or count of negations differ. This module
gives the verdict: the first of these checks on the words of both texts, aligned in order, that tells them apart:
- opposites (opposites.py): a word of one text whose opposite (listed, or an un-/in-/dis-/non- prefix,
  -ful/-less) stands in the other in its place;
- swapped roles: two words shared by both texts whose order flips across a directional word ("to", "than",
  "from") or across a third shared word that stays between them ("Python beats Java" / "Java beats Python")
  (word_order.py); a pronoun of the asker's in one where the other has a third person's ("can he evict me" /
  "can I evict him"), or the same pronouns with their roles traded ("should I pay them" / "should they pay me"),
  or who did it against whom it was done to ("who killed Caesar" / "who did Caesar kill"; "did Brutus kill Caesar"
  / "was Brutus killed by Caesar") (roles.py); clauses that traded their words or their "when" ("why am I tired
  when I wake up" / "why do I wake up when I am tired") (clauses.py);
- moved negation (clauses.py): a negation that sits in another clause in the other text;
- tense and modality (aligned.py): what happened in one where the other asks what will ("why did it fall" / "why
  will it fall"), and what one may do where the other asks what one must ("can I eat sushi" / "must I eat sushi");
- one word replaced (replacements.py): the texts align word for word but for one content word that is not a form
  of the other ("cook rice" / "cook pasta"): a different entity. Or a run of words in place of another between
  the same start and end, three times as long as the run at least ("<a pasted report> summarize it" / "<the same
  report> list its typos");
- words added (replacements.py): one text is the other with a run of content words put in, an instruction or a
  condition added to the same question ("... Answer in one word.", "Explain briefly ...", "... step by step").
Measured against a small NLI cross-encoder and the embedding of the differing words in bench/semantic_quality.py.

`read` (reading.py) does the text work once per text, on the encoder's thread; `agrees` compares two readings (a
few microseconds of set operations), so a candidate costs nothing more off the event loop than the guard did.
"""
from __future__ import annotations

from .aligned import modality_changed, tense_changed
from .clauses import clauses_traded, moved_negation
from .guard import compatible
from .opposites import opposite
from .reading import Reading, read, stem
from .replacements import one_word_replaced, run_replaced, words_added
from .roles import doer_and_done_to, other_person
from .word_order import direction_reversed, swapped

__all__ = ["Reading", "agrees", "disagreement", "read", "stem"]  # read and stem: the callers' one import


def agrees(a: Reading, b: Reading) -> bool:
    """Whether the answer to one text may serve the other."""
    return disagreement(a, b) is None


def disagreement(a: Reading, b: Reading) -> str | None:
    """The first reason the two texts need different answers, or None."""
    if not compatible(a.signature, b.signature):
        return "guard"
    if a.tokens == b.tokens:
        return None
    if opposite(a, b):
        return "opposite"
    if _roles_swapped(a, b):
        return "swapped"
    if moved_negation(a, b) or moved_negation(b, a):
        return "negation"
    if tense_changed(a, b):
        return "tense"
    if modality_changed(a, b):
        return "modal"
    if one_word_replaced(a, b):
        return "replaced"
    if words_added(a, b):
        return "added"
    if run_replaced(a, b):
        return "replaced"
    return None


def _roles_swapped(a: Reading, b: Reading) -> bool:
    """Who does what to whom differs: by word order, by pronoun, by grammar or by clause."""
    return swapped(a, b) or swapped(b, a) or direction_reversed(a, b) or other_person(a, b) \
        or doer_and_done_to(a, b) or clauses_traded(a, b)
