import asyncio

import pytest

from adapters.errors import Overloaded
from proxy.batching import LATENCY_CRITICAL, NORMAL, AdmissionController, Superseded, admission


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


class Holder:
    """Takes a slot and keeps it until released; records the order in which bodies start."""

    def __init__(self, ctl: AdmissionController, started: list[str]):
        self.ctl, self.started = ctl, started
        self.release = asyncio.Event()

    async def run(self, name: str, priority: int = NORMAL, client: str = "", key: str | None = None) -> str:
        async with self.ctl.slot(priority, client, key):
            self.started.append(name)
            await self.release.wait()
        return name


async def test_concurrency_limit_and_fifo_queue():
    ctl, started = AdmissionController(limit=2, max_queue=10, queue_timeout_s=60), []
    h = Holder(ctl, started)
    tasks = [asyncio.create_task(h.run(str(i))) for i in range(5)]
    await settle()
    assert started == ["0", "1"] and ctl.running == 2 and ctl.queued == 3
    h.release.set()
    assert await asyncio.gather(*tasks) == ["0", "1", "2", "3", "4"]
    assert started == ["0", "1", "2", "3", "4"] and ctl.running == 0 and ctl.queued == 0


async def test_a_resized_limit_admits_waiters_at_once_and_shrinks_as_requests_end():
    ctl, started = AdmissionController(limit=1, max_queue=10, queue_timeout_s=60), []
    holders = [Holder(ctl, started) for _ in range(5)]
    tasks = [asyncio.create_task(h.run(str(i))) for i, h in enumerate(holders)]
    await settle()
    ctl.resize(3)  # a backend down at startup has said its slots
    await settle()
    assert started == ["0", "1", "2"] and ctl.running == 3 and ctl.queued == 2
    ctl.resize(1)
    for h in holders[:2]:
        h.release.set()
    await settle()
    assert started == ["0", "1", "2"] and ctl.running == 1  # the two that ended gave their slots up
    for h in holders:
        h.release.set()
    await asyncio.gather(*tasks)
    assert started == ["0", "1", "2", "3", "4"] and ctl.running == 0 and ctl.queued == 0


async def test_latency_critical_requests_jump_the_queue():
    ctl, started = AdmissionController(limit=1, max_queue=10, queue_timeout_s=60), []
    h = Holder(ctl, started)
    tasks = [asyncio.create_task(h.run("busy"))]
    await settle()
    tasks += [asyncio.create_task(h.run("chat1")), asyncio.create_task(h.run("chat2"))]
    await settle()
    tasks.append(asyncio.create_task(h.run("fim", LATENCY_CRITICAL)))
    await settle()
    h.release.set()
    await asyncio.gather(*tasks)
    assert started == ["busy", "fim", "chat1", "chat2"]


async def test_round_robin_between_clients_at_one_priority():
    ctl, started = AdmissionController(limit=1, max_queue=10, queue_timeout_s=60), []
    h = Holder(ctl, started)
    tasks = [asyncio.create_task(h.run("busy"))]
    await settle()
    for name in ["a1", "a2", "a3", "b1", "b2", "c1"]:
        tasks.append(asyncio.create_task(h.run(name, client=name[0])))
        await settle()
    h.release.set()
    await asyncio.gather(*tasks)
    assert started == ["busy", "a1", "b1", "c1", "a2", "b2", "a3"]


async def test_the_client_served_least_recently_goes_first():
    """a was served, then b; b asks again a moment before a does: a, served longer ago, goes first. The queue
    ordered clients by when each one's line was made, and b's, emptied as b was served, was made again before a's."""
    ctl, started = AdmissionController(limit=1, max_queue=10, queue_timeout_s=60), []
    a0, b1, b2, a1 = (Holder(ctl, started) for _ in range(4))
    tasks = [asyncio.create_task(a0.run("a0", client="a"))]
    await settle()
    tasks.append(asyncio.create_task(b1.run("b1", client="b")))
    await settle()
    a0.release.set()  # b is served
    await settle()
    for holder, name in [(b2, "b2"), (a1, "a1")]:  # b asks again first
        tasks.append(asyncio.create_task(holder.run(name, client=name[0])))
        await settle()
    for holder in (b1, b2, a1):
        holder.release.set()
    await asyncio.gather(*tasks)
    assert started == ["a0", "b1", "a1", "b2"]


async def test_a_client_naming_itself_anew_each_time_joins_the_back():
    """A client never served ranked before every client served once, so one that sent a new X-Velo-Client with
    each request went first every time: v's second turn came after all 20 of them."""
    ctl, started = AdmissionController(limit=1, max_queue=30, queue_timeout_s=60), []
    h = Holder(ctl, started)
    async with ctl.slot(client="v"):
        pass
    tasks = [asyncio.create_task(h.run("busy", client="busy"))]
    await settle()
    tasks.append(asyncio.create_task(h.run("v", client="v")))
    await settle()
    for n in range(20):
        tasks.append(asyncio.create_task(h.run(f"x{n}", client=f"x{n}")))
        await settle()
    h.release.set()
    await asyncio.gather(*tasks)
    assert started[:2] == ["busy", "v"]


async def test_clients_remembered_are_bounded(monkeypatch):
    """Clients are names a request chooses (X-Velo-Client): each new one must not be kept for good."""
    monkeypatch.setattr(admission, "_CLIENTS_KEPT", 2)
    ctl = AdmissionController(limit=1, max_queue=10, queue_timeout_s=60)
    for client in ["a", "b", "c"]:
        async with ctl.slot(client=client):
            pass
    assert list(ctl._served) == ["b", "c"]


async def test_full_queue_is_overloaded_with_retry_after():
    ctl, started = AdmissionController(limit=1, max_queue=2, queue_timeout_s=60), []
    h = Holder(ctl, started)
    tasks = [asyncio.create_task(h.run(str(i))) for i in range(3)]
    await settle()
    with pytest.raises(Overloaded) as info:
        async with ctl.slot():
            pass
    assert info.value.retry_after >= 1 and info.value.status == 429
    h.release.set()
    await asyncio.gather(*tasks)


async def test_places_reserved_count_whatever_order_their_requests_come_in():
    """Behind one slot and a queue of one, two places reserved fill it: a request that comes before their owners
    is refused, the owners then run and wait though the queue looks full, and a place given back frees its room."""
    ctl, started = AdmissionController(limit=1, max_queue=1, queue_timeout_s=60), []
    first, second = ctl.reserve(60, "wait"), ctl.reserve(60, "wait")
    with pytest.raises(Overloaded):
        ctl.reserve(60, "wait")
    with pytest.raises(Overloaded):
        async with ctl.slot():
            pass

    async def run(name: str, place: admission.Place | None) -> None:
        async with ctl.slot(place=place):
            started.append(name)
            await settle()
    await asyncio.gather(run("first", first), run("second", second))
    assert started == ["first", "second"] and (ctl.running, ctl.queued) == (0, 0)
    await run("again", second)  # a place already taken is no longer held: an ordinary request
    held = ctl.reserve(60, "wait")
    ctl.give_back(held)
    ctl.give_back(held)  # once only
    assert ctl._reserved == 0 and [ctl.reserve(60, "wait"), ctl.reserve(60, "wait")]


async def test_a_request_waits_at_most_queue_timeout_s_and_leaves_no_trace():
    """Behind a slot that does not free (the backend's timeouts start only once a request runs), a queued request
    waited until it freed: now it leaves with the full queue's error, its place, its key and no slot held."""
    ctl, started = AdmissionController(limit=1, max_queue=10, queue_timeout_s=0.05), []
    h = Holder(ctl, started)
    stuck = asyncio.create_task(h.run("stuck"))
    await settle()
    with pytest.raises(Overloaded) as info:
        await asyncio.wait_for(h.run("late", LATENCY_CRITICAL, "ide", "ide:fim"), 10)  # the bound only on failure
    assert info.value.status == 429 and info.value.retry_after >= 1 and "queue_timeout_s" in info.value.message
    assert ctl.queued == 0 and ctl.running == 1 and ctl._by_key == {} and not stuck.done()
    h.release.set()
    await stuck
    assert await h.run("next") == "next"  # at once: the slot came back
    assert started == ["stuck", "next"] and ctl.running == 0


async def test_each_waiter_leaves_at_its_own_deadline_under_the_queues_one_timer():
    """A request queued behind one that may wait longer (a background response's place) leaves at its own deadline,
    and the longer wait goes on."""
    ctl, started = AdmissionController(limit=1, max_queue=10, queue_timeout_s=0.05), []
    h = Holder(ctl, started)
    stuck = asyncio.create_task(h.run("stuck"))
    await settle()
    place = ctl.reserve(60, "a background response's wait")

    async def patient() -> None:
        async with ctl.slot(place=place):
            started.append("patient")
    waiting = asyncio.create_task(patient())
    await settle()
    with pytest.raises(Overloaded) as info:
        await asyncio.wait_for(h.run("late"), 10)  # the bound only on failure
    assert "0.05 s ([batching] queue_timeout_s)" in info.value.message
    assert not waiting.done() and ctl.queued == 1
    h.release.set()
    await stuck
    await asyncio.wait_for(waiting, 10)
    assert started == ["stuck", "patient"] and ctl.queued == 0 and ctl.running == 0


async def test_cancelled_waiter_leaves_the_queue_without_leaking_a_slot():
    ctl, started = AdmissionController(limit=1, max_queue=10, queue_timeout_s=60), []
    h = Holder(ctl, started)
    busy = asyncio.create_task(h.run("busy"))
    await settle()
    waiters = [asyncio.create_task(h.run(f"w{i}")) for i in range(3)]
    await settle()
    waiters[1].cancel()
    await settle()
    assert ctl.queued == 2
    h.release.set()
    await asyncio.gather(busy, waiters[0], waiters[2])
    assert started == ["busy", "w0", "w2"] and ctl.running == 0 and ctl.queued == 0


async def test_waiter_cancelled_just_after_being_granted_passes_the_slot_on():
    ctl, started = AdmissionController(limit=1, max_queue=10, queue_timeout_s=60), []
    h = Holder(ctl, started)
    busy = ctl.slot()
    await busy.__aenter__()
    granted = asyncio.create_task(h.run("granted"))
    nxt = asyncio.create_task(h.run("next"))
    await settle()
    await busy.__aexit__(None, None, None)  # hands the slot to "granted", which has not resumed yet
    granted.cancel()
    h.release.set()
    await nxt
    assert granted.cancelled() and started == ["next"] and ctl.running == 0


async def test_newer_request_supersedes_a_queued_one():
    # the older one gives its place in line up
    ctl, started = AdmissionController(limit=1, max_queue=1, queue_timeout_s=60), []
    h = Holder(ctl, started)
    busy = asyncio.create_task(h.run("busy"))
    await settle()
    old = asyncio.create_task(h.run("old", LATENCY_CRITICAL, "ide", "ide:fim"))
    await settle()
    new = asyncio.create_task(h.run("new", LATENCY_CRITICAL, "ide", "ide:fim"))
    await settle()
    with pytest.raises(Superseded):
        await old
    assert ctl.queued == 1
    h.release.set()
    await asyncio.gather(busy, new)
    assert started == ["busy", "new"] and ctl.running == 0


async def test_newer_request_supersedes_a_running_one():
    ctl, started = AdmissionController(limit=2, max_queue=10, queue_timeout_s=60), []
    h = Holder(ctl, started)
    old = asyncio.create_task(h.run("old", LATENCY_CRITICAL, "ide", "ide:fim"))
    await settle()
    new = asyncio.create_task(h.run("new", LATENCY_CRITICAL, "ide", "ide:fim"))
    await settle()
    with pytest.raises(Superseded) as info:
        await old
    assert info.value.status == 499
    assert ctl.running == 1
    h.release.set()
    assert await new == "new"
    assert ctl.running == 0


async def test_a_newer_request_refused_for_a_full_queue_leaves_the_older_one_running():
    """It cancelled the older one first, then found the queue full: the user got no completion at all."""
    ctl, started = AdmissionController(limit=1, max_queue=1, queue_timeout_s=60), []
    h = Holder(ctl, started)
    old = asyncio.create_task(h.run("old", LATENCY_CRITICAL, "ide", "ide:fim"))
    await settle()
    chat = asyncio.create_task(h.run("chat"))  # fills the queue
    await settle()
    with pytest.raises(Overloaded):
        async with ctl.slot(LATENCY_CRITICAL, "ide", "ide:fim"):
            pass
    assert not old.done() and ctl.running == 1 and ctl.queued == 1
    h.release.set()
    assert await asyncio.gather(old, chat) == ["old", "chat"]


async def test_supersede_keys_are_per_key():
    ctl, started = AdmissionController(limit=4, max_queue=10, queue_timeout_s=60), []
    h = Holder(ctl, started)
    tasks = [asyncio.create_task(h.run(n, LATENCY_CRITICAL, n, f"{n}:fim")) for n in ["a", "b"]]
    await settle()
    h.release.set()
    assert await asyncio.gather(*tasks) == ["a", "b"]


async def test_external_cancel_of_running_request_is_not_superseded():
    ctl, started = AdmissionController(limit=1, max_queue=10, queue_timeout_s=60), []
    h = Holder(ctl, started)
    task = asyncio.create_task(h.run("x", key="k"))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ctl.running == 0
