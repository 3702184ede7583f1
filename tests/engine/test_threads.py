"""in_passing_thread: the work runs on a thread of its own that is gone afterwards; results and errors come back.
ThreadBudget: as many threads as the cores other processes leave free."""
import threading

import pytest

from engine import threads
from engine.threads import ThreadBudget, in_passing_thread


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


def test_thread_budget_leaves_the_cores_others_keep_busy():
    budget = ThreadBudget(max_threads=2, cores=2)
    assert [budget.for_others_busy(b) for b in (0.0, 0.2, 0.3, 1.0, 1.9)] == [2, 2, 1, 1, 1]
    many = ThreadBudget(max_threads=8, cores=16)
    assert [many.for_others_busy(b) for b in (0.0, 8.0, 10.5, 16.0)] == [8, 8, 5, 1]


def test_thread_budget_sets_torch_threads_from_what_others_used(monkeypatch):
    """A busy loop in another process: its CPU time shows in /proc/stat but not in this process's time."""
    samples = iter([(0.0, 10.0, 5.0), (1.0, 12.0, 6.0), (2.0, 13.1, 7.0)])  # (now, machine busy, own)
    monkeypatch.setattr(threads, "_sample", lambda: next(samples))
    set_to = []
    monkeypatch.setattr(threads.torch, "set_num_threads", set_to.append)
    budget = ThreadBudget(max_threads=2, interval=0.5, cores=2)
    assert budget.apply() == 1 and set_to == [1]   # others used 2 - 1 = 1 core
    assert budget.apply() == 2 and set_to == [1, 2]  # then 0.1
