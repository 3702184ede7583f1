"""Continuous-batching scheduler driven by a fake model (tokens from a hash of the history)."""

import itertools
import random

import pytest
from hypothesis import given, settings, strategies as st

from engine.kv_cache import BlockManager
from engine.scheduler import Scheduler, StepPlan
from engine.sequence import Sequence, SequenceStatus

BS = 4


def fake_token(seq):
    """Deterministic in the sequence's history, like greedy decoding of a fixed model."""
    return (sum(seq.all_ids[-3:]) * 31 + seq.num_tokens) % 50


def step(sched, plan=None):
    """One engine iteration: schedule, check what the runner would get, sample, postprocess."""
    plan = plan or sched.schedule()
    assert plan.items or not sched.has_work, "an empty plan while work remains would spin the engine"
    for item in plan.items:
        assert len(item.token_ids) == len(item.slots) == item.num_tokens
        assert item.slots == sched.blocks.slot_mapping(item.seq, item.start, item.end)
    sampled = {it.seq.seq_id: fake_token(it.seq) for it in plan.items if it.samples}
    finished = sched.postprocess(plan, sampled)
    sched.blocks.check_integrity()
    return plan, finished


def run_all(sched):
    plans, finished = [], []
    while sched.has_work:
        assert len(plans) < 10_000, "no progress"
        plan, done = step(sched)
        plans.append(plan)
        finished += done
    return plans, finished


def make(num_blocks=64, **kw):
    return Scheduler(BlockManager(num_blocks, BS), **kw)


def test_chunked_prefill_samples_only_after_the_whole_prompt():
    sched = make(prefill_chunk=8)
    s = Sequence(1, list(range(20)), max_tokens=2)
    sched.add(s)
    chunks = [step(sched)[0].items for _ in range(3)]
    assert [(i[0].start, i[0].num_tokens, i[0].samples) for i in chunks] == \
        [(0, 8, False), (8, 8, False), (16, 4, True)]
    assert len(s.output_ids) == 1 and s.num_computed == 20
    plan, finished = step(sched)
    assert (plan.items[0].start, plan.items[0].num_tokens) == (20, 1) and finished == [s]
    assert s.finish_reason == "length" and s.block_table == [] and not sched.has_work


def test_postprocess_rejects_a_token_sampled_mid_prompt():
    sched = make(prefill_chunk=4)
    sched.add(Sequence(1, list(range(10)), max_tokens=2))
    plan = sched.schedule()
    with pytest.raises(AssertionError):
        sched.postprocess(plan, {1: 3})


def test_decode_and_prefill_mix_within_the_token_budget():
    sched = make(max_step_tokens=10, prefill_chunk=8)
    a = Sequence(1, [1, 2, 3], max_tokens=10)
    sched.add(a)
    step(sched)
    b, c = Sequence(2, list(range(30)), max_tokens=3), Sequence(3, list(range(30, 60)), max_tokens=3)
    sched.add(b)
    sched.add(c)
    plan, _ = step(sched)
    assert [(i.seq, i.num_tokens) for i in plan.items] == [(a, 1), (b, 8), (c, 1)]
    assert plan.num_tokens == 10
    plan, _ = step(sched)
    assert [(i.seq, i.num_tokens) for i in plan.items] == [(a, 1), (b, 8), (c, 1)]


def test_max_num_seqs_bounds_the_running_set():
    sched = make(max_num_seqs=2)
    for i in range(5):
        sched.add(Sequence(i, [i, i + 1], max_tokens=3))
    step(sched)
    assert (sched.num_running, sched.num_waiting) == (2, 3)


def test_stop_token_finishes_early():
    sched = make()
    s = Sequence(1, [5, 6, 7], max_tokens=50)
    s.stop_token_ids = frozenset({fake_token(s)})
    sched.add(s)
    _, finished = step(sched)
    assert finished == [s] and s.finish_reason == "stop" and len(s.output_ids) == 1


def test_preemption_requeues_newest_first_and_output_is_unchanged():
    prompts = [list(range(i, i + 10)) for i in range(3)]
    roomy = make(num_blocks=64)
    tight = make(num_blocks=8)  # 3 x 10-token prompts need 9 blocks: someone must wait or be preempted
    expected = {}
    for sched in (roomy, tight):
        for i, p in enumerate(prompts):
            sched.add(Sequence(i, p, max_tokens=12))
    _, done = run_all(roomy)
    expected = {s.seq_id: s.output_ids for s in done}
    preempted = []
    while tight.has_work:
        plan, _ = step(tight)
        for victim in plan.preempted:
            assert tight.waiting[0] is victim or victim in tight.waiting
            assert victim.num_computed == 0 and victim.block_table == []
            assert victim.status is SequenceStatus.WAITING
        if plan.preempted:
            assert tight.waiting[0] is plan.preempted[-1]
        preempted += plan.preempted
        for s in tight.running:
            assert s.num_tokens <= 10 + 12
    assert preempted, "the tight budget should force a preemption"
    assert {s.seq_id: s.output_ids for s in preempted} == \
        {s.seq_id: expected[s.seq_id] for s in preempted}
    assert all(len(out) == 12 for out in expected.values())
    tight.blocks.evict(10**6)
    assert tight.blocks.num_free_blocks == 8


def test_shared_prefix_is_served_from_the_cache():
    sched = make(prefill_chunk=64)
    system = list(range(100, 133))
    first = Sequence(1, system + [1, 2], max_tokens=3)
    sched.add(first)
    run_all(sched)
    second = Sequence(2, system + [7, 8, 9], max_tokens=3)
    sched.add(second)
    plan, _ = step(sched)
    assert second.num_cached_prefix == 32
    assert [(i.start, i.num_tokens) for i in plan.items] == [(32, 4)]


def test_a_running_sequences_prompt_is_shared_chunk_by_chunk_before_it_finishes():
    """A prompt's computed blocks are cached as its chunks are done, not only once it finishes: a request sharing
    a long system prompt with one still answering computed the whole prompt again."""
    sched = make(prefill_chunk=16)
    system = list(range(100, 140))  # 40 tokens: 10 blocks
    first = Sequence(1, system + [1, 2], max_tokens=50)
    sched.add(first)
    step(sched)  # its first chunk: 16 tokens
    early = Sequence(2, system[:16] + [5] * 9, max_tokens=3)  # shares only what is done: no cause to wait
    sched.add(early)
    step(sched)
    assert early.num_cached_prefix == 16  # the first chunk's 4 blocks, while `first` still reads its prompt
    while first.is_prefilling:
        step(sched)
    late = Sequence(3, system + [7, 8, 9], max_tokens=3)
    sched.add(late)
    plan, _ = step(sched)
    assert late.num_cached_prefix == 40 and first.status is SequenceStatus.RUNNING
    assert [(i.start, i.num_tokens) for i in plan.items if i.seq is late] == [(40, 3)]
    run_all(sched)
    assert (first.output_ids, late.output_ids) == (_alone(system + [1, 2], 50), _alone(system + [7, 8, 9], 3))
    follow_up = Sequence(4, first.all_ids + [3], max_tokens=1)  # its whole computed conversation stayed cached
    sched.add(follow_up)
    step(sched)
    assert follow_up.num_cached_prefix == (len(first.all_ids) - 1) // BS * BS


def test_requests_sent_at_once_with_one_prompt_prefix_compute_it_once():
    """The first computes the shared prefix; the others wait for each page of it rather than computing the same
    pages beside it in the same steps (four agents' requests with one system prompt each computed it)."""
    sched = make(prefill_chunk=16)
    system = list(range(100, 140))
    seqs = [Sequence(i, system + [i, i + 1], max_tokens=4) for i in range(1, 4)]
    other = Sequence(9, [7] * 30, max_tokens=4)  # shares nothing: never held back
    for seq in [*seqs, other]:
        sched.add(seq)
    plan, _ = step(sched)
    assert [i.seq for i in plan.items] == [seqs[0], other]
    computed = 0
    while sched.has_work:
        plan, _ = step(sched)
        computed += sum(i.num_tokens for i in plan.items if i.seq in seqs[1:] and i.start < i.seq.num_prompt_tokens)
    assert [s.num_cached_prefix for s in seqs[1:]] == [40, 40] and computed == 2 * 2
    assert [s.output_ids for s in seqs] == [_alone(s.prompt_ids, 4) for s in seqs]
    uncached = Scheduler(BlockManager(64, BS, enable_prefix_cache=False), prefill_chunk=16)
    for seq in [Sequence(i, system + [i, i + 1], max_tokens=4) for i in range(1, 4)]:
        uncached.add(seq)
    assert len(step(uncached)[0].items) == 3  # with no cache to reuse, none waits


def _alone(prompt: list[int], max_tokens: int) -> list[int]:
    sched = Scheduler(BlockManager(64, BS, enable_prefix_cache=False))
    seq = Sequence(9, prompt, max_tokens=max_tokens)
    sched.add(seq)
    run_all(sched)
    return seq.output_ids


def test_fork_yields_copy_on_write_pairs():
    sched = make()
    parent = Sequence(1, list(range(6)), max_tokens=5)
    sched.add(parent)
    step(sched)                                    # prefill: position 6 pending, in block 1
    child = sched.fork(parent, 2)
    plan = sched.schedule()
    assert len(plan.copies) == 1
    src, dst = plan.copies[0]
    assert src == child.block_table[1] and dst == parent.block_table[1]  # the first writer copies
    step(sched, plan)
    run_all(sched)
    assert parent.output_ids == child.output_ids  # same history, same fake "greedy" tokens


def test_kv_waste_counts_unused_reserved_slots():
    sched = make()
    assert sched.blocks.kv_waste() == 0.0
    sched.add(Sequence(1, list(range(5)), max_tokens=10))  # 5 tokens in 2 blocks of 4
    step(sched)                                             # +1 sampled token
    assert sched.blocks.kv_waste() == pytest.approx(2 / 8)
    for _ in range(3):
        step(sched)
    assert sched.blocks.kv_waste() == 0.0                   # 9 tokens: 8 written, 1 pending
    step(sched)
    assert sched.blocks.kv_waste() == pytest.approx(2 / 12)


def test_abort_frees_blocks_and_later_postprocess_ignores_it():
    sched = make()
    a, b = Sequence(1, list(range(9)), max_tokens=5), Sequence(2, [1, 2], max_tokens=5)
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()
    assert sched.abort(1) is a and a.finish_reason == "abort" and a.block_table == []
    assert sched.abort(1) is None
    sched.postprocess(plan, {1: 0, 2: 0})
    assert a.output_ids == [] and len(b.output_ids) == 1
    sched.add(c := Sequence(3, [1], max_tokens=5))
    assert sched.abort(3) is c and sched.num_waiting == 0
    sched.blocks.check_integrity()


def test_add_rejects_a_sequence_that_can_never_fit():
    with pytest.raises(ValueError):
        make(num_blocks=4).add(Sequence(1, list(range(10)), max_tokens=8))


def test_no_leak_after_many_random_requests():
    rng = random.Random(1234)
    sched = Scheduler(BlockManager(24, BS), max_num_seqs=8, max_step_tokens=32, prefill_chunk=12)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 20))] for _ in range(5)]
    added, finished, preemptions, copies = 0, 0, 0, 0
    fork_ids = itertools.count(10**6)
    while added < 1000 or sched.has_work:
        for _ in range(rng.randrange(3) if added < 1000 else 0):
            prompt = rng.choice(prefixes)[:rng.randrange(1, 20)] + \
                [rng.randrange(50) for _ in range(rng.randrange(0, 30))]
            sched.add(Sequence(added, prompt or [1], rng.randrange(1, 40), frozenset({0})))
            added += 1
        if sched.has_work and rng.random() < 0.05:
            sched.abort(rng.randrange(added))
        if sched.running and rng.random() < 0.05:
            sched.abort(rng.choice(sched.running).seq_id)
        decoding = [s for s in sched.running if not s.is_prefilling]
        if decoding and rng.random() < 0.05:
            sched.fork(rng.choice(decoding), seq_id=next(fork_ids))
        plan = sched.schedule()
        assert plan.num_tokens <= 32 and sched.num_running <= 8
        preemptions += len(plan.preempted)
        copies += len(plan.copies)
        finished += len(step(sched, plan)[1])
    assert preemptions > 0 and copies > 0 and finished > 500
    bm = sched.blocks
    assert bm.kv_waste() == 0.0 and bm.num_free_blocks + bm.cache.cached_blocks == 24
    bm.evict(bm.num_blocks)
    assert bm.num_free_blocks == 24
    bm.check_integrity()


@settings(max_examples=15, deadline=None)
@given(num_blocks=st.integers(8, 40), block_size=st.integers(1, 6), budget=st.integers(1, 40),
       chunk=st.integers(1, 16), max_seqs=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_every_request_completes_under_any_limits(num_blocks, block_size, budget, chunk, max_seqs, seed):
    rng = random.Random(seed)
    bm = BlockManager(num_blocks, block_size)
    sched = Scheduler(bm, max_num_seqs=max_seqs, max_step_tokens=budget, prefill_chunk=chunk)
    seqs = []
    for i in range(30):
        prompt = [rng.randrange(4) for _ in range(rng.randrange(1, 25))]
        max_tokens = rng.randrange(1, 20)
        if bm.blocks_needed(len(prompt) + max_tokens - 1) <= num_blocks:
            seqs.append(Sequence(i, prompt, max_tokens))
            sched.add(seqs[-1])
    plans, _ = run_all(sched)
    assert all(p.num_tokens <= budget for p in plans)
    assert all(len(s.output_ids) == s.max_tokens and s.finished for s in seqs)
    bm.evict(num_blocks)
    assert bm.num_free_blocks == num_blocks
