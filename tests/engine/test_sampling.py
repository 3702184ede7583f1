"""The vectorised sampler: each row's knobs act on that row only, seeded rows are reproducible."""

from __future__ import annotations

import pytest
import torch

from engine.sampling import SampleRow, Sampler, SamplingParams

PROBS = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])


def row(seed: int | None = None, prompt=(), output=(), **knobs) -> SampleRow:
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return SampleRow(SamplingParams(**knobs), list(prompt), list(output), gen)


def support(n: int = 400, **knobs) -> set[int]:
    """Tokens drawn from PROBS in n samples (one batch of n identical rows)."""
    logits = PROBS.log().repeat(n, 1)
    return set(Sampler(seed=0)(logits, [row(**knobs) for _ in range(n)]).token_ids)


def test_greedy_takes_the_argmax_whatever_shares_the_batch():
    logits = torch.randn(6, 50)
    rows = [row(temperature=0), row(temperature=1.5), row(temperature=0, top_k=3)] * 2
    tokens = Sampler(seed=1)(logits, rows).token_ids
    assert [tokens[i] for i in (0, 2, 3, 5)] == logits.argmax(-1)[[0, 2, 3, 5]].tolist()


@pytest.mark.parametrize("knobs, allowed", [
    ({}, {0, 1, 2, 3, 4}), ({"top_k": 2}, {0, 1}), ({"top_p": 0.8}, {0, 1, 2}), ({"min_p": 0.3}, {0, 1, 2}),
    ({"top_k": 1, "top_p": 0.9}, {0}), ({"top_k": 2, "top_p": 0.5}, {0})])  # top-p renormalises after top-k
def test_filters_bound_the_support(knobs, allowed):
    assert support(**knobs) == allowed


def test_temperature_sharpens_the_distribution():
    logits = PROBS.log().repeat(2000, 1)
    cold = Sampler(seed=0)(logits, [row(temperature=0.3)] * 2000).token_ids
    hot = Sampler(seed=0)(logits, [row(temperature=1.0)] * 2000).token_ids
    assert cold.count(0) > 1.5 * hot.count(0)
    assert abs(hot.count(0) / 2000 - 0.4) < 0.05


def test_seeded_rows_repeat_regardless_of_batch_mates():
    logits = torch.randn(3, 100)
    alone = Sampler()(logits[:1], [row(seed=42)]).token_ids[0]
    mixed = Sampler()(logits[[2, 0, 1]], [row(), row(seed=42), row(seed=7)]).token_ids[1]
    draws = {Sampler()(logits[:1], [row(seed=s)]).token_ids[0] for s in range(30)}
    assert alone == mixed and len(draws) > 1
    filtered_alone = Sampler()(logits[:1], [row(seed=9, top_k=20)]).token_ids[0]
    filtered_mixed = Sampler()(logits[[1, 0, 2]], [row(top_k=50), row(seed=9, top_k=20), row(seed=1, top_p=0.5)])
    assert filtered_alone == filtered_mixed.token_ids[1]


def test_repetition_penalty_matches_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor
    logits = torch.randn(1, 30)
    seen = [3, 7, 7, 12]
    ours = Sampler()(logits, [row(prompt=seen[:2], output=seen[2:], temperature=0, repetition_penalty=1.3,
                                  logprobs=True, top_logprobs=30)])
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([seen]), logits.clone())
    top = dict(ours.top_logprobs[0])
    expected = torch.log_softmax(theirs, -1)[0]
    assert ours.token_ids[0] == int(theirs.argmax())
    assert all(abs(top[t] - expected[t].item()) < 1e-5 for t in range(30))


@pytest.mark.parametrize("last_n, penalised", [(-1, {0, 1, 2}), (2, {1, 2}), (1, {2}), (0, set())])
def test_repetition_penalty_looks_back_repeat_last_n_tokens(last_n, penalised):
    """As Ollama's repeat_last_n: the window spans prompt and output, -1 is everything, 0 nothing."""
    logits = torch.ones(1, 4)
    result = Sampler()(logits, [row(prompt=[0, 1], output=[2], temperature=0, repetition_penalty=2.0,
                                    repeat_last_n=last_n, logprobs=True, top_logprobs=4)])
    top = dict(result.top_logprobs[0])
    assert {t for t in range(4) if top[t] < top[3]} == penalised


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = torch.zeros(1, 5)
    result = Sampler()(logits, [row(prompt=[0], output=[1, 1, 2], temperature=0, presence_penalty=0.5,
                                    frequency_penalty=0.25, logprobs=True, top_logprobs=5)])
    penalised = torch.tensor([0.0, -1.0, -0.75, 0.0, 0.0])
    expected = torch.log_softmax(penalised, -1)
    assert dict(result.top_logprobs[0]) == pytest.approx({t: expected[t].item() for t in range(5)}, abs=1e-6)
    assert result.logprobs[0] == pytest.approx(expected[result.token_ids[0]].item(), abs=1e-6)


def test_logit_bias_bans_and_forces_tokens_per_row_and_leaves_the_logits_alone():
    logits = PROBS.log().repeat(3, 1)
    before = logits.clone()
    rows = [row(temperature=0, logit_bias={0: -100}), row(temperature=0, logit_bias={4: 100, 99: 5}),
            row(temperature=0)]
    assert Sampler(seed=0)(logits, rows).token_ids == [1, 4, 0]  # id 99 is past the vocabulary: ignored
    assert torch.equal(logits, before)
    assert support(logit_bias={0: -100, 1: -100}) == {2, 3, 4}


def test_a_repetition_penalty_at_or_below_zero_is_refused():
    """Dividing a seen token's logit by 0 made it +inf and every logprob NaN; the adapter reads such a value as off."""
    with pytest.raises(ValueError, match="invalid sampling parameters"):
        SamplingParams(repetition_penalty=0.0)


@pytest.mark.parametrize("knobs", [{"temperature": 1e-50}, {"temperature": 1e-40}, {"temperature": 1e-6},
                                   {"temperature": 1e-6, "top_k": 5, "logprobs": True}])
def test_a_vanishing_temperature_is_greedy(knobs):
    """1e-50 was 0 in float32 and 1e-40 made `logits / T` infinite: NaN probabilities, token 0 each step (and
    `torch.multinomial` failed the whole batch where speculation verifies)."""
    logits = torch.randn(4, 50)
    result = Sampler(seed=3)(logits, [row(**knobs) for _ in range(4)])
    assert result.token_ids == logits.argmax(-1).tolist()
    assert all(map(torch.isfinite, map(torch.tensor, result.logprobs or [0.0])))


@pytest.mark.parametrize("knobs", [{"presence_penalty": 1e39}, {"frequency_penalty": -1e39},
                                   {"repetition_penalty": 1e-40}, {"repetition_penalty": 1e300}])
def test_huge_penalties_stay_finite(knobs):
    """1e39 is inf in float32, and inf times an unseen token's count of 0 is NaN: every logprob NaN, token 0."""
    logits = torch.randn(1, 50)
    logits[0, 0] = -10.0  # the argmax of NaNs: token 0
    result = Sampler(seed=3)(logits, [row(prompt=[1, 2], output=[3], temperature=0, logprobs=True, **knobs)])
    assert torch.isfinite(torch.tensor(result.logprobs)).all() and result.token_ids[0] != 0


@pytest.mark.parametrize("greedy", [True, False])
def test_top_logprobs_leave_out_the_tokens_a_grammar_forbids(greedy):
    """A grammar masks forbidden tokens to -inf (engine/constrained.py): where fewer tokens were allowed than
    `top_logprobs` asked, the rest came back as -inf, which JSON writes as null, and OpenAI's `logprob` is a number
    (`{"token": "<|endoftext|>", "logprob": null}` under a response_format)."""
    logits = torch.full((1, 50), float("-inf"))
    logits[0, 7], logits[0, 9] = 2.0, 1.0
    knobs = {"temperature": 0.0} if greedy else {"temperature": 1.0}
    result = Sampler(seed=0)(logits, [row(logprobs=True, top_logprobs=5, **knobs)])
    assert [t for t, _ in result.top_logprobs[0]] == [7, 9]
    assert all(map(torch.isfinite, map(torch.tensor, [lp for _, lp in result.top_logprobs[0]])))
