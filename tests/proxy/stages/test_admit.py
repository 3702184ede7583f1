"""Where an autocomplete is, for replacing one keystroke's request with the next (proxy/stages/admit.py)."""
from proxy.stages.admit import _place

FILE_A = "import os\n\n\ndef load(path):\n    return open(pa"
AFTER_A = ")\n\n\ndef save(path, data):\n    ...\n"
FILE_B = "import json\n\n\ndef parse(text):\n    return json.lo"
AFTER_B = ")\n\n\ndef dump(obj):\n    ...\n"


def test_typing_on_a_line_stays_at_one_place():
    here = _place(FILE_A, AFTER_A)
    assert _place(FILE_A + "t", AFTER_A) == here  # a keystroke
    assert _place(FILE_A[:-1], AFTER_A) == here  # a backspace
    assert _place(FILE_A + "th(", ")" + AFTER_A) == here  # an auto-closed bracket


def test_another_file_or_line_is_another_place():
    here = _place(FILE_A, AFTER_A)
    assert _place(FILE_B, AFTER_B) != here  # another window's file
    assert _place(FILE_A + "th)\n    ", AFTER_A) != here  # Enter: a new line
    assert _place("import os\n\n\ndef lo", "ad(path):\n    return open(path)" + AFTER_A) != here  # a line above
