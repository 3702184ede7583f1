"""Speculative decoding: prompt lookup, adaptive k, exact verification (greedy and rejection sampling), in the
engine."""

from __future__ import annotations

import collections
import itertools
import random
import time

import pytest
import torch
from scipy.stats import chisquare

from engine import EngineConfig, LLMEngine, SamplingParams, default_model_path
from engine.kv_cache import BlockManager
from engine.loader import load
from engine.model_runner import ModelRunner
from engine.sampling import SampleRow, probabilities
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.speculative import (PROBE_EVERY, Acceptance, SpeculativeConfig, SpecStats, ngram_propose, verify_greedy,
                                verify_sampled)
from tests.engine.conftest import collect, generate, submit, tokens_of


# -- prompt lookup ----------------------------------------------------------------------------

def test_ngram_proposes_the_continuation_of_the_latest_match():
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3]
    assert ngram_propose(tokens, 3, n_max=3, n_min=2) == [7, 8, 2]


def test_ngram_prefers_the_longest_suffix():
    tokens = [5, 6, 1, 9, 9, 6, 1, 2, 5, 6, 1]  # "6 1" last seen before 2; "5 6 1" only before 9
    assert ngram_propose(tokens, 2, n_max=3, n_min=2) == [9, 9]


def test_ngram_without_match_or_below_min_proposes_nothing():
    assert ngram_propose([1, 2, 3, 4], 4, n_max=3, n_min=1) == []
    assert ngram_propose([1, 2, 1], 4, n_max=3, n_min=2) == []
    assert ngram_propose([1, 2, 1], 4, n_max=3, n_min=1) == [2, 1]


# -- adaptive k -------------------------------------------------------------------------------

def test_adaptive_k_grows_with_acceptance_and_shrinks_without():
    a = Acceptance()
    for _ in range(10):
        a.update(4, 4)
    assert a.rate > 0.9 and a.best_k(8, 0.1) == 8
    for _ in range(10):
        a.update(4, 0)
    assert a.rate < 0.5 and a.best_k(8, 0.1) == 1


def test_adaptive_k_turns_speculation_off_when_it_does_not_pay_and_probes_now_and_then():
    a = Acceptance()
    for _ in range(20):
        a.update(1, 0)
    ks = [a.best_k(4, 0.5) for _ in range(2 * PROBE_EVERY)]
    assert ks.count(1) == 2 and set(ks) == {0, 1}


def test_spec_stats_report_acceptance_and_tokens_per_step():
    s = SpecStats()
    s.record(4, 5)
    s.record(4, 1)
    d = s.as_dict()
    assert d["spec_acceptance_rate"] == 0.5 and d["spec_tokens_per_step"] == 3.0


# -- verification -----------------------------------------------------------------------------

def test_greedy_keeps_drafts_up_to_the_first_disagreement():
    logits = torch.full((4, 10), -1.0)
    for i, t in enumerate([3, 5, 6, 2]):
        logits[i, t] = 1.0
    assert verify_greedy(logits, [3, 5, 7]) == [3, 5, 6]
    assert verify_greedy(logits, [3, 5, 6]) == [3, 5, 6, 2]
    assert verify_greedy(logits, [4, 5, 6]) == [3]


VOCAB, LENGTH = 4, 3


def _table(seed: int) -> dict[tuple[int, ...], torch.Tensor]:
    """A toy language model: a random next-token distribution for every prefix up to LENGTH tokens."""
    g = torch.Generator().manual_seed(seed)
    return {prefix: torch.softmax(2 * torch.randn(VOCAB, generator=g), dim=0)
            for n in range(LENGTH + 2) for prefix in itertools.product(range(VOCAB), repeat=n)}


def _speculative_run(target, draft, g: torch.Generator, k: int) -> tuple[int, ...]:
    """Decode LENGTH tokens: draft k tokens (sampled from `draft`, or prompt-lookup style constants
    when draft is None), verify them against `target`, repeat."""
    out: tuple[int, ...] = ()
    while len(out) < LENGTH:
        tokens, qs = [], []
        for _ in range(k):
            if draft is None:
                tokens.append((len(out) + len(tokens)) % VOCAB)  # deterministic proposer
            else:
                q = draft[out + tuple(tokens)]
                qs.append(q)
                tokens.append(int(torch.multinomial(q, 1, generator=g)))
        p = torch.stack([target[out + tuple(tokens[:i])] for i in range(k + 1)])
        out += tuple(verify_sampled(p, tokens, torch.stack(qs) if qs else None, g))
    return out[:LENGTH]


@pytest.mark.parametrize("use_draft", [False, True], ids=["one-hot-q", "draft-q"])
def test_rejection_sampling_reproduces_the_target_distribution(use_draft):
    """Chi-square over all VOCAB**LENGTH output sequences: speculative samples vs the exact target
    probabilities. Fixed seeds keep it deterministic; a biased rule (e.g. always accepting, or
    resampling from p instead of the residual) fails it by a wide margin."""
    target, draft = _table(0), (_table(1) if use_draft else None)
    g = torch.Generator().manual_seed(1234)
    n = 12000
    counts = dict.fromkeys(itertools.product(range(VOCAB), repeat=LENGTH), 0)
    for _ in range(n):
        counts[_speculative_run(target, draft, g, k=2)] += 1
    exact = torch.tensor([float(torch.prod(torch.stack([target[seq[:i]][seq[i]] for i in range(LENGTH)])))
                          for seq in counts], dtype=torch.float64)
    expected = (n * exact / exact.sum()).tolist()  # renormalised: float32 rounding only
    assert chisquare(list(counts.values()), expected).pvalue > 1e-3


def test_rejection_sampling_with_identical_draft_accepts_everything():
    p = torch.softmax(torch.randn(3, 6, generator=torch.Generator().manual_seed(0)), dim=-1)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        drafts = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(2)]
        assert verify_sampled(p, drafts, p[:2], g)[:2] == drafts


def test_rejected_token_is_never_resampled_from_a_one_hot_draft():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    g = torch.Generator().manual_seed(0)
    outs = [verify_sampled(p, [0], None, g) for _ in range(200)]
    assert all(o[0] == 1 for o in outs if len(o) == 1)  # rejected 0: the residual has only token 1
    assert any(len(o) == 1 for o in outs) and any(len(o) == 2 for o in outs)


# -- in the engine ----------------------------------------------------------------------------

GREEDY = dict(temperature=0, ignore_eos=True)


def _prompts() -> list[list[int]]:
    """Prompts that repeat themselves, as code edits do, so prompt lookup finds matches."""
    rng = random.Random(0)
    out = []
    for i in range(6):
        piece = [rng.randrange(256) for _ in range(5 + i)]
        out.append(piece * 3 + piece[:2])
    return out


def _spec_engine(engine_factory, path: str, draft: str | None = None, draft_vocab: int = 0, **config):
    # the tiny drafts cost as much as the target: tell the engine they are free, or it stops drafting;
    # and speculate in batches of any size, so the tests exercise it under continuous batching
    spec = SpeculativeConfig("draft", 4, draft, draft_cost=0, max_batch=10**6, draft_vocab=draft_vocab) if draft \
        else SpeculativeConfig("ngram", 4, ngram_min=1, max_batch=10**6)
    return engine_factory(path, block_size=4, speculative=spec, **config)


# a draft that scores only ids below this: the tiny byte-level vocabulary is ~260, the prompts use 0..255
PART = 100


def _assert_no_leaks(eng) -> None:
    """Everything finished: every block is free or only cached, refcounts match, draft KV all free."""
    deadline = time.monotonic() + 10
    while eng.metrics()["running"] or eng.metrics()["waiting"]:  # the snapshot follows the last step
        assert time.monotonic() < deadline
        time.sleep(0.01)
    eng.blocks.check_integrity()
    assert eng.blocks.num_available_blocks == eng.blocks.num_blocks
    if eng.speculator.draft is not None:
        eng.speculator.draft.blocks.check_integrity()
        assert eng.speculator.draft.blocks.num_free_blocks == eng.speculator.draft.blocks.num_blocks


@pytest.mark.parametrize("draft, vocab",
                         [(None, 0), ("tiny_draft", 0), ("tiny_llama", 0), ("tiny_draft", PART)],
                         ids=["ngram", "draft-model", "self-draft", "draft-model-part-vocab"])
def test_greedy_output_is_identical_with_and_without_speculation(request, tiny_llama, engine_factory, draft, vocab):
    plain = engine_factory(tiny_llama, block_size=4)
    spec = _spec_engine(engine_factory, tiny_llama, request.getfixturevalue(draft) if draft else None, vocab)
    for prompt in _prompts():
        expected = tokens_of(generate(plain, prompt, SamplingParams(max_tokens=30, **GREEDY)))
        assert tokens_of(generate(spec, prompt, SamplingParams(max_tokens=30, **GREEDY))) == expected
    _assert_no_leaks(spec)
    m = spec.metrics()
    assert m["spec_steps"] > 0 and (m["spec_tokens_per_step"] > 1 or draft is None)
    if draft == "tiny_llama":
        assert m["spec_acceptance_rate"] == 1.0  # the target drafting for itself is always right


def test_a_stop_string_inside_accepted_drafts_ends_the_tokens_there_too(tiny_llama, engine_factory):
    """A step keeps several drafts: the tokens after the one that completed a stop string went out in `token_ids`
    and the usage (21 tokens where the same answer without speculation has 18, on SmolLM2)."""
    plain = engine_factory(tiny_llama, block_size=4)
    spec = _spec_engine(engine_factory, tiny_llama, tiny_llama)  # the target drafting for itself: all accepted
    prompt = _prompts()[0]
    text = "".join(o.text for o in generate(plain, prompt, SamplingParams(max_tokens=30, **GREEDY)))
    for at in range(4, 14):  # the stop string completed at each place of a step's five tokens
        params = SamplingParams(max_tokens=30, stop=[text[at:at + 2]], **GREEDY)
        expected, got = generate(plain, prompt, params), generate(spec, prompt, params)
        assert tokens_of(got) == tokens_of(expected) and len(tokens_of(got)) < 30
        assert got[-1].num_output_tokens == expected[-1].num_output_tokens == len(tokens_of(got))
        assert "".join(o.text for o in got) == "".join(o.text for o in expected)
    assert spec.metrics()["spec_tokens_per_step"] > 1
    _assert_no_leaks(spec)


def test_no_speculation_while_more_sequences_decode_than_max_batch(tiny_llama, engine_factory):
    plain = engine_factory(tiny_llama, block_size=4)
    spec = engine_factory(tiny_llama, block_size=4, speculative=SpeculativeConfig("ngram", 4, ngram_min=1, max_batch=1))
    prompt = _prompts()[0]
    params = SamplingParams(max_tokens=20, **GREEDY)
    expected = tokens_of(generate(plain, prompt, params))
    pair = [submit(spec, prompt, params)[1] for _ in range(2)]  # decode side by side, finish together
    assert [tokens_of(collect(q)) for q in pair] == [expected, expected]
    assert spec.metrics()["spec_steps"] == 0
    assert tokens_of(generate(spec, prompt, params)) == expected  # alone: speculates
    assert spec.metrics()["spec_steps"] > 0
    _assert_no_leaks(spec)


def test_a_seeded_sampled_request_draws_the_same_tokens_alone_and_beside_another(tiny_llama, engine_factory):
    """Verifying drafts draws from a row's generator otherwise than a plain step, and a busy batch turns speculation
    off: the same seed gave other tokens from the 10th on beside one other request (max_batch 1)."""
    spec = engine_factory(tiny_llama, block_size=4, speculative=SpeculativeConfig("ngram", 4, ngram_min=1, max_batch=1))
    first, second = _prompts()[:2]
    seeded = SamplingParams(max_tokens=30, temperature=0.7, seed=123, ignore_eos=True)
    alone = tokens_of(generate(spec, first, seeded))
    pair = [submit(spec, first, seeded)[1], submit(spec, second, SamplingParams(max_tokens=30, temperature=0.7,
                                                                                 seed=5, ignore_eos=True))[1]]
    assert [tokens_of(collect(q)) for q in pair][0] == alone
    _assert_no_leaks(spec)


@pytest.mark.parametrize("draft", [None, "tiny_draft"], ids=["ngram", "draft-model"])
def test_mixed_batch_with_prefix_cache_and_tight_memory_matches_solo_runs(request, tiny_llama, engine_factory, draft):
    """Speculative and plain (penalised) requests decode together, the second round from cached
    prefixes, with so little KV memory that drafts are dropped and sequences preempted: outputs still
    equal solo runs and no block leaks."""
    plain = engine_factory(tiny_llama, block_size=4)
    slot = plain.runner.kv[:, :, 0].numel() * plain.runner.kv.element_size()
    spec = _spec_engine(engine_factory, tiny_llama, request.getfixturevalue(draft) if draft else None,
                        kv_memory=slot * 4 * 40, max_step_tokens=48)
    prompts = _prompts()
    params = [SamplingParams(max_tokens=30, repetition_penalty=1.3 if i % 3 == 0 else 1.0, **GREEDY)
              for i in range(len(prompts))]
    solo = [tokens_of(generate(plain, p, sp)) for p, sp in zip(prompts, params)]
    for _ in range(2):
        queues = [submit(spec, p, sp)[1] for p, sp in zip(prompts, params)]
        assert [tokens_of(collect(q)) for q in queues] == solo
    _assert_no_leaks(spec)
    m = spec.metrics()
    assert m["spec_steps"] > 0 and (m["spec_accepted"] > 0 or draft is None), str(m)
    assert m["cache_hit_tokens"] > 0 and m["preemptions"] > 0, str(m)


@pytest.mark.parametrize("draft, vocab", [(None, 0), ("tiny_draft", 0), ("tiny_draft", PART)],
                         ids=["ngram", "draft-model", "draft-model-part-vocab"])
def test_sampled_engine_output_follows_the_target_distribution(request, tiny_llama, engine_factory, draft, vocab):
    """Chi-square over the first three tokens (top-3 at temperature 1.5: 27 outcomes) of speculative requests
    (drawn from the engine's seeded generator: a request with a seed of its own is not speculated) against the
    target's exact probabilities, computed without any cache. With a part vocabulary the draft's q is zero outside
    it: drafts come only from there, the target's residual from all."""
    eng = _spec_engine(engine_factory, tiny_llama, request.getfixturevalue(draft) if draft else None, vocab, seed=0)
    # prompt lookup needs the sampled token in the prompt: give it every byte once
    prompt = _prompts()[0] if draft else random.Random(1).sample(range(256), 256)
    params = dict(max_tokens=3, temperature=1.5, top_k=3, ignore_eos=True)
    n = 1500
    queues = [submit(eng, prompt, SamplingParams(**params))[1] for _ in range(n)]
    counts = collections.Counter(tuple(tokens_of(collect(q))) for q in queues)
    _assert_no_leaks(eng)
    assert eng.metrics()["spec_steps"] > 0 and (eng.metrics()["spec_accepted"] > 0 or draft is None)
    row = SampleRow(SamplingParams(**params), [], [])

    def dist(ids: list[int]) -> torch.Tensor:
        logits = eng.runner.model.logits(eng.runner.hidden_states(ids)[-1:])
        return probabilities(logits, [row])[0]

    exact = {}
    p1 = dist(prompt)
    for a in p1.nonzero()[:, 0].tolist():
        p2 = dist(prompt + [a])
        for b in p2.nonzero()[:, 0].tolist():
            p3 = dist(prompt + [a, b])
            for c in p3.nonzero()[:, 0].tolist():
                exact[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    assert set(counts) <= set(exact)
    total = sum(exact.values())
    assert chisquare([counts[k] for k in exact], [n * v / total for v in exact.values()]).pvalue > 1e-3


def test_scheduler_verifies_drafts_within_the_budget_and_rolls_back_rejected_ones():
    blocks = BlockManager(num_blocks=16, block_size=4)
    sched = Scheduler(blocks, max_step_tokens=6)
    seq = Sequence(1, [1, 2, 3], 20)
    sched.add(seq)
    sched.postprocess(sched.schedule(), {1: 7})              # prefill, first token
    plan = sched.schedule({1: [8, 9, 10, 11, 12, 13]})        # 1 + 6 tokens > budget: draft dropped
    assert plan.items[0].draft == [] and plan.items[0].num_tokens == 1
    sched.postprocess(plan, {1: 8})
    plan = sched.schedule({1: [9, 10, 11, 12, 13]})
    item = plan.items[0]
    assert item.token_ids == [8, 9, 10, 11, 12, 13] and item.samples and len(seq.block_table) == 3
    sched.postprocess(plan, {1: [9, 5]})                      # 9 kept, then the target's own 5
    assert seq.output_ids == [7, 8, 9, 5] and seq.num_computed == 6
    assert len(seq.block_table) == 2                          # the block of positions 8..11 went back
    blocks.check_integrity()
    plan = sched.schedule({1: [6]})
    sched.postprocess(plan, {1: [6, 2]})
    assert seq.output_ids == [7, 8, 9, 5, 6, 2] and seq.num_computed == 8
    blocks.check_integrity()


@pytest.mark.slow
def test_shipped_smollm2_greedy_is_identical_with_prompt_lookup():
    """Real weights on a code-editing request (the answer copies the prompt): the same tokens with
    and without speculation, and most drafts accepted."""
    loaded = load(default_model_path(), torch.float32, "cpu", progress=False)
    code = "def area(w, h):\n    if w < 0 or h < 0:\n        raise ValueError('negative')\n    return w * h\n"
    text = f"Rename `area` to `rect_area` and reply with the whole function only.\n```python\n{code}```"
    prompt = loaded.tokenizer.encode(loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}]))
    outputs, engines = [], []
    for spec in (None, SpeculativeConfig("ngram", 4)):
        config = EngineConfig(progress=False, dtype="float32", speculative=spec)
        engines.append(LLMEngine(ModelRunner(loaded.model, 256, 16), loaded.tokenizer, loaded.info, config, 256))
        outputs.append(tokens_of(generate(engines[-1], prompt, SamplingParams(max_tokens=48, **GREEDY))))
    _assert_no_leaks(engines[1])
    m = engines[1].metrics()
    for eng in engines:
        eng.shutdown()
    assert outputs[0] == outputs[1]
    assert m["spec_acceptance_rate"] > 0.3 and m["spec_tokens_per_step"] > 1.5, str(m)
