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
