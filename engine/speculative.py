"""Speculative decoding: propose k tokens cheaply, check them all in one batched target forward pass.

Proposers: prompt lookup (the continuation of the latest earlier occurrence of the sequence's last n
tokens; no second model) and a small draft model with the target's tokenizer (engine/draft_model.py).
Verification is distribution-exact (Leviathan et al., 2023): greedy rows keep drafts while they equal the
target's argmax; sampled rows keep draft x with probability min(1, p(x)/q(x)) and on the first rejection
draw from norm(max(0, p - q)). A deterministic proposer (prompt lookup, or a greedy draft) has q = one-hot,
so the rule becomes "keep x with probability p(x), else draw from p without x". Either way the emitted
tokens follow the target's distribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.config import SpeculativeConfig
from engine.sampling import SampleRow, SamplingParams, probabilities
from engine.sequence import Sequence

if TYPE_CHECKING:
    from engine.draft_model import DraftModelProposer


def ngram_propose(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix
    (n_max down to n_min tokens); [] when the suffix never occurred before."""
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)  # excludes the suffix itself
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + k]
    return []


PROBE_EVERY = 16


@dataclass
class Acceptance:
    """One sequence's running per-token acceptance rate (decayed counts, so it follows drift), and
    the draft length that maximises expected tokens per unit of cost, 0 when plain decoding wins."""
    accepted: float = 2.0  # prior: 2 of 3, so a new sequence starts with a useful k
    trials: float = 3.0
    decay: float = 0.8
    idle: int = 0          # steps since speculation last paid off; every PROBE_EVERY-th probes with k=1

    @property
    def rate(self) -> float:
        return self.accepted / self.trials

    def update(self, proposed: int, accepted: int) -> None:
        """Drafts are kept up to the first rejection: `accepted` successes, then one failure if any left."""
        self.accepted = self.decay * self.accepted + accepted
        self.trials = self.decay * self.trials + accepted + (accepted < proposed)

    def best_k(self, k_max: int, token_cost: float) -> int:
        """argmax over k of E[tokens per step] / cost, E = (1 - a^(k+1)) / (1 - a), cost = 1 + c*k, with
        c the cost of one more draft token (verifying it, drafting it) relative to a plain step."""
        a = min(self.rate, 1 - 1e-6)
        gain = {k: (1 - a ** (k + 1)) / (1 - a) / (1 + token_cost * k) for k in range(1, k_max + 1)}
        k = max(gain, key=gain.get)
        if gain[k] > 1:
            self.idle = 0
            return k
        self.idle = (self.idle + 1) % PROBE_EVERY
        return 1 if self.idle == 0 else 0  # a probe now and then notices when drafts get good again


def verify_greedy(target_logits: torch.Tensor, draft: list[int]) -> list[int]:
    """target_logits: (k+1, vocab) at the pending token and each draft. Returns the drafts that equal
    the target's argmax, then the target's own token at the first mismatch (or after the last draft)."""
    best = target_logits.argmax(dim=-1).tolist()
    n = next((i for i, (d, b) in enumerate(zip(draft, best)) if d != b), len(draft))
    return draft[:n] + [best[n]]


def verify_sampled(target_probs: torch.Tensor, draft: list[int], draft_probs: torch.Tensor | None,
                   generator: torch.Generator | None) -> list[int]:
    """Rejection sampling. target_probs: (k+1, vocab) p at each position; draft_probs: (k, vocab) the
    q the drafts were drawn from, or None for a deterministic proposer (q = one-hot). Returns the kept
    drafts plus one token drawn from the residual (on rejection) or from p after the last draft."""
    k = len(draft)
    idx = torch.arange(k)
    drafted = torch.tensor(draft, dtype=torch.long)
    p = target_probs[idx, drafted]
    q = draft_probs[idx, drafted] if draft_probs is not None else torch.ones(k)
    u = torch.rand(k, generator=generator)
    rejected = (u * q >= p).nonzero()  # u < p/q keeps the draft; q > 0 for every drawn token
    n = int(rejected[0]) if len(rejected) else k
    if n == k:
        residual = target_probs[k]
    elif draft_probs is not None:
        residual = (target_probs[n] - draft_probs[n]).clamp(min=0)
    else:
        residual = target_probs[n].clone()
        residual[draft[n]] = 0
    if residual.sum() <= 0:  # p == q up to rounding: the residual has no mass, p itself is exact
        residual = target_probs[n]
    return draft[:n] + [int(torch.multinomial(residual, 1, generator=generator))]


@dataclass
class SpecStats:
    """Counters for metrics: acceptance rate and tokens emitted per verifying target step."""
    steps: int = 0      # sequence-steps that verified at least one draft
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0    # accepted drafts plus the target's own token, per verifying step

    def record(self, proposed: int, emitted: int) -> None:
        self.steps += 1
        self.proposed += proposed
        self.accepted += emitted - 1
        self.emitted += emitted

    def as_dict(self) -> dict:
        return {"spec_steps": self.steps, "spec_proposed": self.proposed, "spec_accepted": self.accepted,
                "spec_acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
                "spec_tokens_per_step": self.emitted / self.steps if self.steps else 0.0}


@dataclass
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None = None  # (k, vocab) q the tokens were drawn from; None: deterministic


class Speculator:
    """The engine's speculative-decoding state: drafts for eligible decoding sequences before a step,
    verification of the target's logits after it, adaptive k per sequence, metrics."""

    def __init__(self, config: SpeculativeConfig, draft: DraftModelProposer | None = None):
        assert (config.method == "draft") == (draft is not None)
        self.config, self.draft = config, draft
        self.acceptance: dict[int, Acceptance] = {}
        self.stats = SpecStats()

    def propose(self, seqs: list[Sequence], rows: list[SampleRow], generator: torch.Generator) -> dict[int, Draft]:
        """seq_id -> non-empty draft, for the given running, decoding sequences (never past max_tokens)."""
        ks = [self._k(s) for s in seqs]
        if self.draft is not None:
            drafts = self.draft.propose(seqs, ks, rows, generator)
        else:
            c = self.config
            drafts = [Draft(ngram_propose(s.all_ids, k, c.ngram_max, c.ngram_min)) for s, k in zip(seqs, ks)]
        return {s.seq_id: d for s, d in zip(seqs, drafts) if d.tokens}

    def verify(self, seq: Sequence, logits: torch.Tensor, draft: Draft, row: SampleRow,
               generator: torch.Generator) -> list[int]:
        """Tokens to append for seq: kept drafts plus one from the target. logits: (k+1, vocab)."""
        logits = logits.float().cpu()
        if row.params.greedy:
            tokens = verify_greedy(logits, draft.tokens)
        else:
            probs = probabilities(logits, [row] * len(logits))
            tokens = verify_sampled(probs, draft.tokens, draft.probs, row.generator or generator)
        self.acceptance.setdefault(seq.seq_id, Acceptance()).update(len(draft.tokens), len(tokens) - 1)
        self.stats.record(len(draft.tokens), len(tokens))
        return tokens

    def retain(self, seq_ids: set[int]) -> None:
        """Forget sequences no longer running (finished, aborted, preempted), draft KV included."""
        self.acceptance = {sid: a for sid, a in self.acceptance.items() if sid in seq_ids}
        if self.draft is not None:
            self.draft.retain(seq_ids)

    def _k(self, seq: Sequence) -> int:
        left = seq.max_tokens - len(seq.output_ids) - 1  # the target adds one token of its own
        c = self.config
        cost = c.token_cost + (0.0 if self.draft is None else self.draft.cost if c.draft_cost is None else c.draft_cost)
        best = self.acceptance.setdefault(seq.seq_id, Acceptance()).best_k(c.num_tokens, cost)
        return max(0, min(best, left))


def eligible(params: SamplingParams) -> bool:
    """Speculation needs a per-position distribution that does not depend on the drafts themselves:
    no history penalties and no grammar; logprobs are reported by the plain path only, and so is a seeded random
    row drawn: verifying draws from its generator otherwise than a plain step, and a busy batch turns speculation
    off, so its tokens depended on what else ran."""
    return (params.repetition_penalty == 1 and not params.presence_penalty and not params.frequency_penalty
            and not params.logprobs and not params.top_logprobs and params.grammar is None and not params.logit_bias
            and (params.greedy or params.seed is None))
