"""The draft model proposer: the part of the vocabulary it scores, its cost, and the vocabulary check."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine
from engine.draft_model import DraftModelProposer, draft_cost
from engine.loader import load
from engine.model_runner import ModelRunner
from engine.sequence import Sequence
from engine.speculative import SpeculativeConfig
from tests.engine.tiny import write_tiny_model

PART = 100  # the draft scores only ids below this: the tiny byte-level vocabulary is ~260, prompts use 0..255


def test_a_part_vocabulary_draft_scores_low_ids_and_the_sequences_own(tiny_draft):
    loaded = load(tiny_draft)
    runner = ModelRunner(loaded.model, 16, 4)
    proposer = DraftModelProposer(runner, 16, 4, cost=0.0, vocab=PART)
    mirrors = [Sequence(1, [5, 250, 120, 250], 10), None, Sequence(2, [7, 101], 10)]
    ids = proposer._scored_ids(mirrors)
    assert ids.tolist() == list(range(PART)) + [101, 120, 250]
    hidden = torch.randn(3, loaded.model.cfg.hidden_size)
    assert torch.allclose(proposer._head(ids)(hidden), loaded.model.logits(hidden)[:, ids], atol=1e-5)
    q = torch.softmax(torch.randn(len(ids)), dim=0)
    full = proposer._full(q, ids)
    assert full.shape == (loaded.model.cfg.vocab_size,) and torch.equal(full[ids], q) and full.sum() == pytest.approx(1)
    assert draft_cost(loaded.model, loaded.model, PART) < draft_cost(loaded.model, loaded.model, 0) == 1.0
    assert DraftModelProposer(runner, 16, 4, 0.0, vocab=0).vocab is None  # 0: all of it
    assert DraftModelProposer(runner, 16, 4, 0.0, vocab=10**6).vocab is None  # past the vocabulary: all of it
    with pytest.raises(ValueError):
        SpeculativeConfig("draft", 4, "d.gguf", draft_vocab=-1)


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama, tmp_path):
    other = write_tiny_model(str(tmp_path), "llama", vocab_size=300)
    with pytest.raises(ValueError, match="vocabulary differs"):
        LLMEngine.from_pretrained(tiny_llama,
                                  EngineConfig(progress=False, speculative=SpeculativeConfig("draft", 4, other)))


@pytest.mark.parametrize("graphs,vocab,expected", [(False, 0, False), (True, 0, True), (True, PART, False)])
def test_the_draft_runner_takes_the_engines_cuda_graphs_setting_and_speculative_batch(
        tiny_llama, tiny_draft, engine_factory, monkeypatch, graphs, vocab, expected):
    """It made its own (every decode as a graph, buckets to 256, captured mid-request) whatever the engine's setting;
    a head scoring part of the vocabulary never runs in one, so it gets none."""
    from engine import draft_model
    made = []
    monkeypatch.setattr(draft_model, "ModelRunner", lambda *a, **k: made.append(k) or ModelRunner(*a, **k))
    engine_factory(tiny_llama, cuda_graphs=graphs, speculative=SpeculativeConfig(
        method="draft", draft_model=tiny_draft, max_batch=3, draft_vocab=vocab))
    assert made == [{"cuda_graphs": expected, "max_batch": 3}]
