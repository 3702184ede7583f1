"""Speculative decoding: proposers, adaptive k, exact verification (greedy and rejection sampling), KV rollback."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from engine.kv_cache import BlockManager
from engine.sequence import Sequence, SequenceStatus
from engine.speculative import (Acceptance, SpecStats, ngram_propose, release_rejected_blocks, verify_greedy,
                                verify_sampled)


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


# -- KV rollback ------------------------------------------------------------------------------

def _decoding_sequence(blocks: BlockManager, prompt_len: int) -> Sequence:
    seq = Sequence(1, list(range(prompt_len)), 64)
    assert blocks.allocate_prompt(seq)
    seq.status = SequenceStatus.RUNNING
    blocks.append_slots(seq, seq.num_uncomputed)
    seq.num_computed = seq.num_tokens
    seq.output_ids.append(100)
    return seq


@pytest.mark.parametrize("kept", [0, 1, 5, 9])
def test_rollback_frees_exactly_the_blocks_of_rejected_drafts(kept):
    blocks = BlockManager(num_blocks=16, block_size=4)
    seq = _decoding_sequence(blocks, prompt_len=6)  # 7 tokens, position 6 pending
    free_before = blocks.num_free_blocks
    k = 9
    assert blocks.append_slots(seq, 1 + k) == []     # pending token + 9 drafts: positions 6..15
    assert len(seq.block_table) == 4
    start = seq.num_computed
    seq.output_ids += [200 + i for i in range(kept)] + [300]  # kept drafts and the target's token
    seq.num_computed = start + 1 + kept
    released = release_rejected_blocks(blocks, seq)
    assert len(seq.block_table) == min(4, blocks.blocks_needed(seq.num_tokens))  # never grows
    assert released == 4 - len(seq.block_table)
    assert blocks.num_free_blocks == free_before - (len(seq.block_table) - 2)
    blocks.check_integrity()
    blocks.free(seq)
    blocks.check_integrity()
    assert blocks.num_available_blocks == blocks.num_blocks


def test_rollback_keeps_blocks_shared_with_the_prefix_cache():
    blocks = BlockManager(num_blocks=16, block_size=4)
    first = _decoding_sequence(blocks, prompt_len=9)
    blocks.free(first)  # caches two full blocks
    seq = Sequence(2, list(range(9)) + [100], 64)
    assert blocks.allocate_prompt(seq) and seq.num_cached_prefix == 8
    seq.status = SequenceStatus.RUNNING
    blocks.append_slots(seq, seq.num_uncomputed)
    seq.num_computed = seq.num_tokens
    seq.output_ids.append(7)
    blocks.append_slots(seq, 1 + 6)
    seq.output_ids.append(8)  # every draft rejected
    seq.num_computed += 1
    release_rejected_blocks(blocks, seq)
    assert len(seq.block_table) == 3
    blocks.check_integrity()
