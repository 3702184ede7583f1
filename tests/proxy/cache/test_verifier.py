"""The verifier: questions an embedding scores as near-equal that need another answer, one category each, and
paraphrases it must still let through."""
from __future__ import annotations

import pytest

from proxy.cache.verifier import agrees, disagreement, read, stem

_LONG = ("What are the main differences between the way Python and Go handle concurrency, including goroutines, "
         "threads, the global interpreter lock and asyncio event loops?")
_LEASE = "My landlord wants to raise the rent by a lot next month and says I have to sign a new lease, "
_KITTEN = ("I adopted a kitten from the shelter last month and I am trying to understand her behaviour and her "
           "sleeping habits, ")
_BAKERY = "I run a small bakery with three employees and we are trying to cut costs without lowering quality, "
_ROME = "For my history homework about the Roman republic and its fall, "
_PAGE = ("I am building a small web page for my team's internal tools with plain JavaScript and no framework, it has a "
         "table of servers, a search box, a few buttons that call our API and a panel that shows the details of the "
         "selected server, and I keep getting confused by the DOM API and its details, ")
_LEGACY = ("I am cleaning up a big legacy codebase at work with lots of old modules and I am trying to plan the "
           "refactoring carefully with my team, ")
_SHOP = ("I am working on a Django web app for a small shop with products, orders and customers, and I want clean and "
         "idiomatic code, ")  # naming twice the words a question swaps
_STORE = "I run a small online store and I am setting up my accounting, taxes and payments for the first time, "
_MINUTES = ("The committee met on Tuesday to discuss the budget for the coming year. Several members raised concerns "
            "about rising costs in the maintenance department, while others argued that investment in new equipment "
            "would save money over time. After a long debate, the chair proposed a compromise that would split the "
            "available funds between repairs and purchases.\n\n")
MUST_MISS = {
    "opposite": [
        ("How do I increase my metabolism?", "How do I decrease my metabolism?"),
        ("Should I include the header in the count?", "Should I exclude the header from the count?"),
        ("How do I encode a URL in Python?", "How do I decode a URL in Python?"),
        ("What should I eat before a workout?", "What should I eat after a workout?"),
        ("Is it legal to record a phone call?", "Is it illegal to record a phone call?"),
        ("What are the advantages and disadvantages of studying abroad?",
         "What are the disadvantages and disadvantages of studying abroad?"),
        ("What is the best way and best book for cost accounting?",
         "What is the worst way and best book for cost accounting?"),
        ("Is a careful driver a good driver?", "Is a careless driver a good driver?"),
        (_KITTEN + "do all cats sleep during the day?", _KITTEN + "do some cats sleep during the day?"),  # 0.983
        # when, against another time (cosine 0.988 and 0.968)
        ("I am writing a report for my economics class about Germany, its industry, its exports and its "
         "unemployment, what happened to the economy since 2010?", "I am writing a report for my economics class "
         "about Germany, its industry, its exports and its unemployment, what happened to the economy until 2010?"),
        ("I am trying to eat healthier and lose some weight before my wedding in the summer, what should I eat before "
         "running?", "I am trying to eat healthier and lose some weight before my wedding in the summer, what should "
         "I eat while running?"),
        ("What should I drink during a marathon?", "What should I drink after a marathon?"),
        # the degrees of a listed pair (cosine 0.98 for the first: the embedding reads the rest)
        ("I run a small online shop selling handmade candles and soaps and want to grow my customer base through "
         "social media and email, what is the fastest way to do it",
         "I run a small online shop selling handmade candles and soaps and want to grow my customer base through "
         "social media and email, what is the slowest way to do it"),
        ("What is the largest lake in Canada?", "What is the smallest lake in Canada?"),
        ("Which planet is the hottest?", "Which planet is the coldest?"),
        ("Who is the oldest person alive?", "Who is the youngest person alive?"),
        ("When is the earliest I can retire?", "When is the latest I can retire?"),
        ("Is a bigger engine better?", "Is a smaller engine better?"),
    ],
    "swapped": [
        ("How do I convert rows to columns in Excel?", "How do I convert columns to rows in Excel?"),
        ("Does a dog chase a cat?", "Does a cat chase a dog?"),
        ("How much is 20 USD in EUR?", "How much is 20 EUR in USD?"),  # a conversion's direction
        ("How do I translate English to French?", "How do I translate French to English?"),
        ("Is Python faster than Java?", "Is Java faster than Python?"),
        ("Why are Apple products more expensive than Dell products?",
         "Why are Dell products more expensive than Apple products?"),
        ("What is the journey from failure to topper?", "What is the journey from topper to failure?"),
        ("Will Britain return the diamond to India?", "Will India return the diamond to Britain?"),
        # "one" read as a number is a word whose place counts, not a stop word (cosine 0.980 and 0.974)
        ("Count from one to ten.", "Count from ten to one."),
        ("Print the numbers one through five", "Print the numbers five through one"),
        # whose: a pronoun is a stop word to the other checks (cosine 0.963, 0.981 and 0.962)
        (_LEASE + "can he do that without notice?", _LEASE + "can I do that without notice?"),
        (_LEASE + "can he evict me?", _LEASE + "can I evict him?"),
        (_LEASE + "what are my rights?", _LEASE + "what are his rights?"),
        # who did it, or who it was done to (cosine 0.978 and 0.963)
        (_ROME + "who killed Caesar?", _ROME + "who did Caesar kill?"),
        (_ROME + "who did Brutus betray?", _ROME + "who betrayed Brutus?"),
        (_ROME + "did Brutus kill Caesar?", _ROME + "was Brutus killed by Caesar?"),  # the passive's agent (0.981)
        # the same pronouns, their roles traded (cosine 0.981 and 0.986)
        (_BAKERY + "how much should I pay them per hour?", _BAKERY + "how much should they pay me per hour?"),
        (_BAKERY + "can I pay them less than the minimum wage?",
         _BAKERY + "can they pay me less than the minimum wage?"),
        # across a preposition, the words next to it not the ones swapped (cosine 0.991, 0.984, 0.992 and 0.986)
        (_LEGACY + "how do I replace tabs with spaces in every file?",
         _LEGACY + "how do I replace spaces with tabs in every file?"),
        (_LEGACY + "how do I merge the feature branch into main?",
         _LEGACY + "how do I merge main into the feature branch?"),
        (_LEGACY + "how do I rename the column user_id to account_id?",
         _LEGACY + "how do I rename the column account_id to user_id?"),
        (_SHOP + "how do I count orders per customer?", _SHOP + "how do I count customers per order?"),
        # the asker acting in one, acted on in the other (cosine 0.974)
        (_STORE + "do I charge vat to customers in germany?", _STORE + "do customers in germany charge me vat?"),
        # clauses that traded their words, or their "when" (cosine 0.986 and 0.975)
        ("what time is it in new york when it is noon in london?",
         "what time is it in london when it is noon in new york?"),
        ("why do I feel tired when I wake up early?", "why do I wake up early when I feel tired?"),
    ],
    "negation": [
        ("Why can't I sleep when I am tired?", "Why can I sleep when I am not tired?"),
        ("I don't love myself, what should I do to love myself?",
         "I do love myself, what should I not do to love myself?"),
    ],
    "tense": [  # cosine 0.960
        ("I have been investing a small part of my salary in index funds and a few tech stocks for the past two years, "
         "why did tech stocks fall?", "I have been investing a small part of my salary in index funds and a few tech "
         "stocks for the past two years, why will tech stocks fall?"),
        ("What did the central bank do about inflation?", "What will the central bank do about inflation?"),
    ],
    "modal": [  # may or must (cosine 0.978)
        ("I am pregnant with my first baby and trying to eat healthy, avoid alcohol and get enough sleep, can I eat "
         "sushi?", "I am pregnant with my first baby and trying to eat healthy, avoid alcohol and get enough sleep, "
         "must I eat sushi?"),
    ],
    "replaced": [
        ("How do I cook rice in a pressure cooker?", "How do I cook pasta in a pressure cooker?"),
        ("How can I lose weight without exercise?", "How can I lose height without exercise?"),
        ("How do I become a designer at Google?", "How do I become an engineer at Google?"),
        # a modifier replaced by a word that is none (cosine 0.988), and how often, which is no modifier (0.968)
        ("Summarize the following paragraph about the history of the Roman empire, its rise, its emperors and its "
         "fall, in a simple way", "Summarize the following paragraph about the history of the Roman empire, its rise, "
         "its emperors and its fall, in a detailed way"),
        ("My doctor told me to watch my diet because of my blood pressure, should I take fish oil daily?",
         "My doctor told me to watch my diet because of my blood pressure, should I take fish oil monthly?"),
        ("Should I water my lawn weekly?", "Should I water my lawn daily?"),
        # a name that another starts with (cosine 0.965 and 0.967)
        ("I am building my first iPhone app for tracking my running workouts and I want to show the list of past "
         "runs with dates and distances, how do I make a list in swift?", "I am building my first iPhone app for "
         "tracking my running workouts and I want to show the list of past runs with dates and distances, how do I "
         "make a list in swiftui?"),
        ("I am building a small dashboard for my team with charts, tables and a login page, and I want to keep the "
         "state of the filters in one place, how do I manage state in vue?", "I am building a small dashboard for my "
         "team with charts, tables and a login page, and I want to keep the state of the filters in one place, how "
         "do I manage state in vuex?"),
        ("how do I reverse a string in java", "how do I reverse a string in javascript"),
        ("what is the capital of niger", "what is the capital of nigeria"),
        # how often (cosine 0.972 and 0.992 after the preamble)
        (_KITTEN + "do cats usually sleep during the day?", _KITTEN + "do cats rarely sleep during the day?"),
        (_KITTEN + "why do cats frequently sleep during the day?",
         _KITTEN + "why do cats occasionally sleep during the day?"),
        # words that only start alike (cosine 0.967 and 0.928 after the preamble)
        (_PAGE + "should I set innerHTML or textContent for the details panel?",
         _PAGE + "should I set innerText or textContent for the details panel?"),
        (_PAGE + "is it safe to assign user input to innerHTML?",
         _PAGE + "is it safe to assign user input to innerText?"),
        ("when should I use parseInt in javascript?", "when should I use parseFloat in javascript?"),
        # the same passage, another instruction of more than one word (cosine 0.980)
        (_MINUTES + "Summarize the text above.", _MINUTES + "List the spelling mistakes in the text above."),
        (_MINUTES + "Summarize this.", _MINUTES + "Turn this into a poem."),
    ],
    "added": [  # an instruction on the answer's shape, or a condition, after the same question
        (_LONG, _LONG + " Respond only with yes or no."),
        (_LONG, _LONG + " Keep it short."),
        (_LONG, "Briefly: " + _LONG),
        ("Explain how photosynthesis works in plants, including the light-dependent reactions and the Calvin cycle",
         "Explain how photosynthesis works in plants, including the light-dependent reactions and the Calvin cycle "
         "step by step"),
        ("Explain how photosynthesis works in plants", "Explain briefly how photosynthesis works in plants"),
        ("Summarize this text: " + _LONG, "Summarize this text in bullet points: " + _LONG),
        # a verb's -ing form after the word put in, its plain form before (cosine 0.969 and 0.966)
        ("My grandmother has been feeling tired lately and she has trouble sleeping at night, which vitamins should "
         "she take?", "My grandmother has been feeling tired lately and she has trouble sleeping at night, which "
         "vitamins should she stop taking?"),
        ("I work from home most days and my internet provider sometimes throttles my connection in the evening, "
         "should I use a VPN?", "I work from home most days and my internet provider sometimes throttles my "
         "connection in the evening, should I stop using a VPN?"),
        ("Why should I write tests?", "Why should I stop writing tests?"),
    ],
}

MAY_HIT = [
    ("How do I learn Python quickly?", "How can I learn Python fast?"),
    ("How do I learn Python quickly?", "What is the fastest way to learn Python?"),
    ("What is the difference between a list and a tuple?", "What is the difference between a tuple and a list?"),
    ("Can we travel in time?", "Can we time travel?"),
    ("What are good tips for self study?", "What are some tips for self studying?"),
    ("How does it feel to be old physically?", "Physically, how does it feel to be old?"),
    ("Why is it that everybody wants to go to heaven yet no one wants to die?",
     "Why is it that everyone wants to go to heaven, but nobody wants to die?"),
    ("Explain how a hash map works", "explain how a hash map works."),
    ("What are the benefits of meditation?", "What are the benefits of meditating?"),  # forms of one word
    ("What is the best programing language to learn?", "What is the best programming language to learn?"),
    ("What is your favourite historical movie?", "What is your favorite historical movie?"),  # spellings of one word
    ("What are the most embarrassing moments in life?", "What are the most embarassing moments in life?"),
    ("How do I learn Python quickly and easily?", "How do I learn Python fast?"),  # modifiers for a modifier
    ("What's the time complexity of quicksort?", "What is the time complexity of quick sort?"),  # a compound apart
    ("what time is it in new york when it is noon in london?",  # a clause moved whole, with its "when"
     "when it is noon in london, what time is it in new york?"),
    ("If Quora was banned in India, what would happen?", "What would happen if Quora was banned in India?"),
    ("What would happen if Quora was banned in India?", "What will happen to Quora if it is banned in India?"),
    (_LEGACY + "should the controller call the service or the service call the controller?",  # cosine 0.992
     _LEGACY + "should the service call the controller or the controller call the service?"),
    ("How do I set up my VPN?", "How do you set up a VPN?"),  # the asker named once, "you" either side
    ("What is the difference between a list and a tuple in Python?",
     "What's the difference between tuples and lists in Python?"),
]


@pytest.mark.parametrize("reason,a,b", [(r, a, b) for r, pairs in MUST_MISS.items() for a, b in pairs])
def test_verifier_refuses_look_alikes_that_need_another_answer(reason: str, a: str, b: str):
    assert disagreement(read(b), read(a)) == reason
    assert not agrees(read(a), read(b))


@pytest.mark.parametrize("a,b", MAY_HIT)
def test_verifier_lets_paraphrases_through(a: str, b: str):
    assert disagreement(read(b), read(a)) is None
    assert disagreement(read(a), read(b)) is None


def test_stem_matches_inflections_only():
    assert stem("increases") == stem("increase") == "increase"
    assert stem("studying") == stem("study") == "study"
    assert stem("class") == "class"


def test_content_words_match_their_forms_that_drop_a_silent_e():
    assert read("take it, use it, write it").content == read("taking it, using it, writing it").content
    assert read("used").content == read("uses").content
