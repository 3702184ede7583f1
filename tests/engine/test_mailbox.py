"""Outputs posted from the engine thread reach their queues in order, with one wake-up of the loop per burst."""

import asyncio
import gc
import threading
import weakref

import pytest

from engine.mailbox import Mailbox, mailbox_for


async def test_a_burst_from_another_thread_arrives_in_order_with_one_wake_up():
    loop = asyncio.get_running_loop()
    box, queues = mailbox_for(loop), [asyncio.Queue() for _ in range(3)]
    assert mailbox_for(loop) is box
    wakes = 0
    deliver = box._deliver

    def counted() -> None:
        nonlocal wakes
        wakes += 1
        deliver()
    box._deliver = counted
    posted = threading.Event()

    def engine_thread() -> None:
        for step in range(2):
            for i, q in enumerate(queues):
                box.post(q, (step, i))
        posted.set()
    threading.Thread(target=engine_thread).start()
    posted.wait()  # blocks the loop on purpose, as a busy loop is while the engine thread posts a step
    got = [[await q.get(), await q.get()] for q in queues]
    assert got == [[(0, i), (1, i)] for i in range(3)] and wakes == 1


def test_posting_to_a_closed_loop_raises_and_a_later_loop_still_gets_its_own():
    loop = asyncio.new_event_loop()
    box = Mailbox(loop)
    loop.close()
    with pytest.raises(RuntimeError):
        box.post(asyncio.Queue(), "late")
    with pytest.raises(RuntimeError):  # not left "scheduled", which would drop the rest silently
        box.post(asyncio.Queue(), "later")


def test_a_closed_loop_is_not_kept_alive_by_its_mailbox():
    """The mailbox held its loop, the key of a WeakKeyDictionary: every loop that ever called generate() stayed in
    memory, closed, with what was still posted to it (5,000 asyncio.run calls: 5,000 mailboxes, +16 MB)."""
    async def delivered() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        thread = threading.Thread(target=mailbox_for(asyncio.get_running_loop()).post, args=(queue, "out"))
        thread.start()
        assert await queue.get() == "out"
        thread.join()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(delivered())
    box = mailbox_for(loop)
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None
    with pytest.raises(RuntimeError):  # a request still running for it: its outputs have nobody to go to
        box.post(asyncio.Queue(), "late")
