import asyncio
import contextlib

from adapters.errors import BackendError
from adapters.protocol import Chunk
from proxy.batching import Coalescer


class Upstream:
    """A fake backend stream released one chunk at a time by the test."""

    def __init__(self, n: int = 3, fail_after: int | None = None):
        self.n, self.fail_after = n, fail_after
        self.calls = 0
        self.closed = asyncio.Event()
        self.cancelled = False
        self.gate = asyncio.Queue()

    async def stream(self):
        self.calls += 1
        try:
            for i in range(self.n):
                await self.gate.get()
                if self.fail_after == i:
                    raise BackendError("upstream died")
                yield Chunk(text=str(i), finish_reason="stop" if i == self.n - 1 else None)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed.set()

    def release(self, k: int = 1):
        for _ in range(k):
            self.gate.put_nowait(None)


async def collect(co: Coalescer, key: str, up: Upstream) -> list[str]:
    return [c.text async for c in co.stream(key, up.stream)]


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


async def test_identical_requests_share_one_backend_call_and_every_chunk():
    co, up = Coalescer(), Upstream()
    first = asyncio.create_task(collect(co, "k", up))
    await settle()
    up.release()
    await settle()
    late = asyncio.create_task(collect(co, "k", up))  # joins after chunk 0: gets it replayed
    await settle()
    up.release(2)
    assert await first == ["0", "1", "2"]
    assert await late == ["0", "1", "2"]
    assert up.calls == 1 and co.coalesced == 1 and co.in_flight == 0


async def test_different_keys_and_finished_flights_do_not_share():
    co, up = Coalescer(), Upstream(n=1)
    up.release(3)
    a, b = await asyncio.gather(collect(co, "a", up), collect(co, "b", up))
    assert await collect(co, "a", up) == ["0"]
    assert a == b == ["0"] and up.calls == 3 and co.coalesced == 0


async def test_follower_leaving_does_not_stop_the_others():
    co, up = Coalescer(), Upstream()
    leader = asyncio.create_task(collect(co, "k", up))
    follower = asyncio.create_task(collect(co, "k", up))
    await settle()
    up.release()
    await settle()
    follower.cancel()
    await settle()
    up.release(2)
    assert await leader == ["0", "1", "2"]
    assert follower.cancelled() and not up.cancelled


async def test_backend_cancelled_only_when_all_callers_are_gone():
    co, up = Coalescer(), Upstream()
    callers = [asyncio.create_task(collect(co, "k", up)) for _ in range(3)]
    await settle()
    for task in callers[:2]:
        task.cancel()
    await settle()
    assert not up.closed.is_set()
    callers[2].cancel()
    await asyncio.wait_for(up.closed.wait(), 1)
    assert up.cancelled and co.in_flight == 0


async def test_closing_the_stream_early_cancels_the_backend():
    co, up = Coalescer(), Upstream()
    up.release()
    async with contextlib.aclosing(co.stream("k", up.stream)) as stream:
        async for chunk in stream:
            assert chunk.text == "0"
            break
    assert up.cancelled and co.in_flight == 0


async def test_error_reaches_every_caller():
    co, up = Coalescer(), Upstream(fail_after=1)
    callers = [asyncio.create_task(collect(co, "k", up)) for _ in range(3)]
    await settle()
    up.release(2)
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(r, BackendError) for r in results)
    assert up.calls == 1


async def test_a_shared_call_cancelled_from_outside_fails_every_caller():
    """A pump cancelled by anything but its last caller leaving (a shutdown) ended the flight with no error: every
    caller got the chunks so far as a whole answer, which the cache then kept."""
    co, up = Coalescer(), Upstream(n=3)
    callers = [asyncio.create_task(collect(co, "k", up)) for _ in range(2)]
    await settle()
    up.release(1)
    await settle()
    [flight] = co._flights.values()
    flight.pump.cancel()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(r, BackendError) for r in results), results


async def test_joiners_are_counted():
    co, up = Coalescer(), Upstream(n=1)
    callers = [asyncio.create_task(collect(co, "k", up)) for _ in range(4)]
    await settle()
    up.release()
    await asyncio.gather(*callers)
    assert co.coalesced == 3


async def test_a_caller_that_joined_gets_each_chunk_through_own_and_the_first_caller_as_it_came():
    co, up = Coalescer(), Upstream(n=2)
    first = asyncio.create_task(collect_own(co, up))
    await asyncio.sleep(0)
    second = asyncio.create_task(collect_own(co, up))
    await asyncio.sleep(0)
    up.release(2)
    assert await first == ["0", "1"] and await second == ["0+", "1+"] and up.calls == 1


async def collect_own(co: Coalescer, up: Upstream) -> list[str]:
    return [c.text async for c in co.stream("k", up.stream, own=lambda c: Chunk(text=c.text + "+"))]


async def test_the_call_is_paid_for_by_its_first_caller_then_by_the_first_one_still_there_when_the_payer_left():
    """Who pays for a shared call: the caller that started it; where it leaves before the end, the first caller still
    there, told what the one that left got (the limit stage charges it the rest). A caller that left before it
    was the payer takes nothing over, nor does anyone from a payer that got the whole answer."""
    co, up = Coalescer(), Upstream()
    told: dict[str, list[str]] = {}

    async def caller(name: str) -> list[str]:
        def bill(paid: list[Chunk] | None, upto: list[Chunk] | None) -> None:
            assert paid is not None
            told[name] = [c.text for c in paid]
            assert upto is None
        return [c.text async for c in co.stream("k", up.stream, bill=bill)]
    tasks = {name: asyncio.create_task(caller(name)) for name in "LABC"}
    await settle()
    tasks["A"].cancel()
    up.release()
    await settle()
    tasks["L"].cancel()  # after chunk 0: B, the first still there, pays from here
    await settle()
    up.release()
    await settle()
    tasks["B"].cancel()
    await settle()
    up.release()
    assert await tasks["C"] == ["0", "1", "2"]
    assert told == {"B": ["0"], "C": ["0", "1"]}
    finished = [asyncio.create_task(caller(name)) for name in ("M", "N")]
    await settle()
    up.release(3)
    await asyncio.gather(*finished)
    assert told == {"B": ["0"], "C": ["0", "1"]} and up.calls == 2


async def test_a_payer_that_left_after_every_other_caller_got_the_whole_answer_and_went_pays_for_all_of_it():
    """The first caller, slow to take its chunks (a client that stopped reading), left after the one riding on its
    call had got the whole answer and gone: nobody still there to pay for the rest, so the one that left does."""
    co, up = Coalescer(), Upstream()
    billed: list[tuple[list[Chunk] | None, list[str]]] = []

    def bill(paid: list[Chunk] | None, upto: list[Chunk] | None) -> None:
        assert upto is not None
        billed.append((paid, [c.text for c in upto]))
    up.release()
    async with contextlib.aclosing(co.stream("k", up.stream, bill=bill)) as first:
        assert (await anext(first)).text == "0"
        second = asyncio.create_task(collect(co, "k", up))
        await settle()
        up.release(2)
        assert await second == ["0", "1", "2"] and billed == []
    assert billed == [(None, ["0", "1", "2"])] and up.calls == 1 and not up.cancelled
