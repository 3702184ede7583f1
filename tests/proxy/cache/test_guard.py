"""The false-hit guard: texts an embedding puts close together that must not share an answer, and paraphrases
that still may."""
from __future__ import annotations

import pytest

from proxy.cache.guard import compatible, signature

MUST_MISS = [
    ("What is 2 + 2?", "What is 2 + 3?"),
    ("Convert 10 km to miles", "Convert 100 km to miles"),
    ("Give me three examples of prime numbers", "Give me four examples of prime numbers"),
    ("What is the capital of Austria?", "What is the capital of Australia?"),
    ("Who was the first president of France?", "Who was the first president of Germany?"),
    ("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?"),
    ("Why do cats like milk?", "Why don't cats like milk?"),
    ("Is it true that coffee is healthy?", "Is it false that coffee is healthy?"),
    ("What does `list.sort()` return?", "What does `sorted(list)` return?"),
    ("Fix this: ```x = foo(1)```", "Fix this: ```x = foo(2)```"),
    ("What does os.path.join do?", "What does os.path.split do?"),
    ("What is 7-3?", "What is 3-7?"),  # the same numbers in another expression
    ("What is 3/4 as a decimal?", "What is 4/3 as a decimal?"),
    ("What is 2 + 3?", "What is 2 * 3?"),
    # whitespace a program reads: which lines a loop's body holds, fenced or pasted bare
    ("What does this print?\n```python\nfor i in range(3):\n    print(i)\n    print('done')\n```",
     "What does this print?\n```python\nfor i in range(3):\n    print(i)\nprint('done')\n```"),
    ("What does this print?\nfor i in range(3):\n    print(i)\n    print('done')",
     "What does this print?\nfor i in range(3):\n    print(i)\nprint('done')"),
    ("Is this valid YAML?\n```\na:\n  b: 1\nc: 2\n```", "Is this valid YAML?\n```\na:\n  b: 1\n  c: 2\n```"),
]

MAY_HIT = [
    ("How do I learn Python quickly?", "What is the fastest way to learn Python?"),
    ("What are good tips for self study?", "What are smart tips for self studying?"),
    ("Explain how a hash map works", "explain how a hash map works."),
    ("What is 2 + 2?", "what is 2+2"),
    ("Fix this: ```x = foo(1)```", "Fix this:\n```\n    x = foo(1)  \n\n```"),  # spaces no program reads
    ("What does this print?\nfor i in x:\n    f(i)", "  What does this print?\n  for i in x:\n      f(i)\n"),
    ("Why is it unsafe to eat raw eggs?", "Why is it not safe to eat raw eggs?"),
    # number words inside idioms and pronouns are no numbers
    ("How can I read a whole book in one go?", "How can I read an entire book in a single sitting?"),
    ("How does one prepare for a ServiceNow interview?", "How can I prepare for a ServiceNow interview?"),
    ("How can I write a message to one of the users of Quora?", "How do I message a Quora user?"),
    ("Which is the best phone under 20k?", "Which is the best phone under 20,000?"),
    # casing: capitals on common words, Title Case, pronouns
    ("What is the most beautiful word? What does it mean to YOU?", "What is the most beautiful word to you?"),
    ("How Do I Get Better At Public Speaking?", "how do i get better at public speaking"),
    ("How do I get hired if I'm overqualified?", "How do I get a job when overqualified?"),
    # punctuation, accents, possessives and plurals
    ("Why is Pokémon GO so popular?", "Why is Pokemon GO so popular?"),
    ("How do you describe the personality of the Greeks?", "What are some Greek personality traits?"),
    ("I lied to my girlfriend.What should I do?", "I lied to my girlfriend, what should I do?"),
    ("What are the best German beers sold in the U.S.?", "What are the best German beers sold in the US?"),
    # negations that ask instead of deny
    ("Is sleeping on the floor good for your back?", "Is sleeping on the floor good for your back? Why or why not?"),
    ("How do I know if she likes me?", "How do I know if she likes me or not?"),
]


@pytest.mark.parametrize("a,b", MUST_MISS)
def test_guard_refuses_texts_that_differ_in_numbers_names_negation_or_code(a: str, b: str):
    assert not compatible(signature(a), signature(b))
    assert not compatible(signature(b), signature(a))


@pytest.mark.parametrize("a,b", MAY_HIT)
def test_guard_lets_paraphrases_through(a: str, b: str):
    assert compatible(signature(a), signature(b))
