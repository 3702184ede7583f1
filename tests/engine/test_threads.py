"""in_passing_thread: the work runs on a thread of its own that is gone afterwards; results and errors come back."""
import threading

import pytest

from engine.threads import in_passing_thread


def test_runs_on_a_thread_that_ends_and_returns_the_result():
    seen = []

    def work(a, b=0):
        seen.append(threading.current_thread())
        return a + b

    assert in_passing_thread(work, 2, b=3) == 5
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()


def test_reraises_the_error():
    def fail():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        in_passing_thread(fail)
