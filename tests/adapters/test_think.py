"""<think>...</think> told apart from the answer in streamed pieces, tags split anywhere."""
from __future__ import annotations

import pytest

from adapters.think import ThinkSplitter, opens_thinking

TEXT = "<think>Let me see: 2 < 3.</think>\n\nYes, 2 < 3."


def split(pieces: list[str], thinking: bool = False) -> tuple[str, str]:
    s, thought, answer = ThinkSplitter(thinking), "", ""
    for p in pieces:
        t, a = s.feed(p)
        thought, answer = thought + t, answer + a
    t, a = s.flush()
    return thought + t, answer + a


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, len(TEXT)])
def test_any_split_gives_the_same_fields(size):
    assert split([TEXT[i:i + size] for i in range(0, len(TEXT), size)]) == ("Let me see: 2 < 3.", "Yes, 2 < 3.")


def test_a_prompt_that_opened_the_block_starts_in_thinking():
    assert split(["Hmm.", "</think>", "Done."], thinking=True) == ("Hmm.", "Done.")
    assert opens_thinking("<|im_start|>assistant\n<think>\n") and not opens_thinking("<think>\n\n</think>\n\n")


def test_text_without_tags_is_all_answer_and_a_cut_tag_is_not_lost():
    assert split(["No tags ", "<b>here</b>", " <thin"]) == ("", "No tags <b>here</b> <thin")
    assert split(["<think>cut off mid-thou", "ght"]) == ("cut off mid-thought", "")


def test_a_prompt_that_names_the_tag_does_not_open_the_block():
    """Only a prompt that ends with <think> opens it (Ollama's test): a user's question about the tag had the whole
    answer sent as thinking."""
    prompt = "<|im_start|>user\nWhat does the <think> tag do?<|im_end|>\n<|im_start|>assistant\n"
    assert not opens_thinking(prompt) and split(["It marks reasoning."], opens_thinking(prompt)) == \
        ("", "It marks reasoning.")


@pytest.mark.parametrize("text, fields", [
    # after the block, a tag is the answer's text (a code sample, nested or repeated tags): it went back to thinking
    ("<think>r</think>Use the `<think>` tag: <think>x</think> done",
     ("r", "Use the `<think>` tag: <think>x</think> done")),
    ("<think>a<think>b</think>c</think>d", ("a<think>b", "c</think>d")),
    # a tag after other text opens nothing, as in Ollama
    ("```html\n<think>hi</think>\n```", ("", "```html\n<think>hi</think>\n```")),
    # whitespace right inside and after the block, and before it, is layout, however the stream is cut
    ("\n\n<think>\nI reason\n</think>\n\nAnswer", ("I reason\n", "Answer")),
])
def test_the_block_is_read_as_ollama_reads_it_wherever_the_stream_is_cut(text, fields):
    for size in range(1, len(text) + 1):
        assert split([text[i:i + size] for i in range(0, len(text), size)]) == fields, size
