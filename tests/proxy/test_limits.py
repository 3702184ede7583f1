"""Per-key token buckets (proxy/limits.py) on a fake clock."""
from __future__ import annotations

import pytest

from proxy.limits import KeyLimits, LimitsConfig, RateLimited


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limits(**cfg) -> tuple[KeyLimits, Clock]:
    clock = Clock()
    return KeyLimits(LimitsConfig(**cfg), clock), clock


def test_requests_pass_up_to_the_burst_then_refill_at_the_rate():
    lim, clock = limits(requests_per_minute=60, request_burst=3)
    for _ in range(3):
        lim.admit("k", 0)
        lim.done("k", 0)
    with pytest.raises(RateLimited) as refused:
        lim.admit("k", 0)
    assert refused.value.limit == "requests" and refused.value.status == 429
    assert refused.value.retry_after == pytest.approx(1.0)  # one request a second
    lim.admit("other", 0)  # each key its own bucket
    clock.now += 1.0
    state = lim.admit("k", 0)
    assert state.requests == (3, 0, pytest.approx(3.0)) and lim.refused == {("k", "requests"): 1}


def test_tokens_are_taken_up_front_and_trued_up_to_the_real_count():
    lim, clock = limits(tokens_per_minute=600)  # 10 a second, burst 600
    lim.admit("k", 100)
    assert lim.state("k").tokens[1] == 500
    lim.done("k", 350)  # the answer used 450 in all
    assert lim.state("k").tokens[1] == 150
    lim.admit("k", 100)
    lim.done("k", 200)  # 300 used: the bucket is 150 in debt
    with pytest.raises(RateLimited) as refused:
        lim.admit("k", 1)
    assert refused.value.limit == "tokens" and refused.value.retry_after == pytest.approx(15.1)
    clock.now += 16
    lim.admit("k", 1)


def test_a_share_reserved_is_taken_once_or_given_back_with_its_tokens():
    """A request admitted later takes its share at once, so the next is refused now; its request admitted with it is
    charged nothing more, and a share its request never took gives back its tokens and its place running."""
    lim, _ = limits(requests_per_minute=60, request_burst=2, tokens_per_minute=600, concurrency=2)
    used, unused = lim.reserve("k", 100), lim.reserve("k", 50)
    with pytest.raises(RateLimited):
        lim.reserve("k", 0)
    assert lim.take(used) and not lim.take(used)  # once
    lim.give_back(unused)
    lim.give_back(unused)  # once
    lim.give_back(used)  # taken: its request ends with `done`
    assert not lim.take(unused) and lim.running() == {"k": 1} and lim.state("k").tokens[1] == 500
    lim.done("k", 20)
    assert lim.running() == {} and lim.state("k").tokens[1] == 480 and lim.state("k").requests[1] == 0


def test_a_prompt_larger_than_the_burst_waits_for_a_full_bucket_not_forever():
    lim, clock = limits(tokens_per_minute=60, token_burst=50)
    lim.admit("k", 500)
    lim.done("k", 0)
    with pytest.raises(RateLimited):
        lim.admit("k", 500)
    clock.now += 600
    lim.admit("k", 500)


def test_concurrency_caps_requests_running_at_once_per_key():
    lim, _ = limits(concurrency=2)
    lim.admit("k", 0)
    lim.admit("k", 0)
    with pytest.raises(RateLimited) as refused:
        lim.admit("k", 0)
    assert refused.value.limit == "concurrency" and lim.running() == {"k": 2}
    lim.done("k", 0)
    lim.admit("k", 0)


def test_no_limits_configured_is_inactive():
    assert not KeyLimits(LimitsConfig()).active


def test_made_up_keys_cost_a_sweep_of_all_keys_only_now_and_then():
    """Before: past 10,000 keys, every new key that found none idle swept them all again (a client sending a new
    made-up key with each request made each request O(keys) on the event loop)."""
    lim, clock = limits(requests_per_minute=60)
    sweeps = []
    sweep = lim._drop_idle
    lim._drop_idle = lambda: (sweeps.append(len(lim.keys)), sweep())[1]  # type: ignore[method-assign]
    for i in range(30_000):
        lim.admit(f"made-up-{i}", 0, label="other")
        lim.done(f"made-up-{i}", 0)
    assert sweeps == [10_000, 20_000]  # nothing was idle (no time passed), so nothing was dropped
    clock.now += 60  # every bucket refilled: all idle
    lim.admit("one-more", 0)
    assert len(lim.keys) == 30_001  # under the next sweep mark
    assert lim.sweep_at == 40_000


def test_new_limits_apply_as_if_in_force_all_along_and_keep_running_requests():
    lim, clock = limits(requests_per_minute=60, request_burst=5, tokens_per_minute=600, concurrency=2)
    for _ in range(2):
        lim.admit("k", 100)  # two requests running, 2 of 5 requests and 200 of 600 tokens used
    lim.reconfigure(LimitsConfig(requests_per_minute=60, request_burst=3, tokens_per_minute=1200, concurrency=2))
    assert lim.state("k").requests == (3, 1, pytest.approx(2.0)) and lim.state("k").tokens[:2] == (1200, 1000)
    with pytest.raises(RateLimited) as refused:
        lim.admit("k", 0)
    assert refused.value.limit == "concurrency"  # its running requests are still counted
    lim.done("k", 0)
    lim.admit("k", 0)  # the third of three
    lim.done("k", 0)
    with pytest.raises(RateLimited):
        lim.admit("k", 0)
    lim.reconfigure(LimitsConfig(requests_per_minute=60))
    assert lim.state("k").tokens is None and lim.state("k").requests == (60, 57, pytest.approx(3.0))
    lim.reconfigure(LimitsConfig(requests_per_minute=60, tokens_per_minute=60))
    assert lim.state("k").tokens == (60, 60, 0.0)  # a limit turned on starts full
