"""Turn a batch of logits into next tokens, each row with its own sampling knobs, in a few tensor ops.

Order (as in vLLM): penalties on raw logits -> logprobs are taken here (the model's distribution after
penalties, before temperature) -> temperature -> top-k / top-p / min-p masks -> sample. Random rows use
the exponential race (`argmax(p / E)`, E ~ Exp(1)), so a seeded request draws its noise from its own
`torch.Generator` and gets the same tokens whatever else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0       # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0                 # 0 or -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # >1 discourages any token in the prompt or the output so far
    presence_penalty: float = 0.0    # OpenAI-style, on output tokens only
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p <= 1:
            raise ValueError(f"invalid sampling parameters: {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class SampleRow:
    """One row of the batch: its knobs, its history (for penalties) and its generator (if seeded)."""
    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None = None


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None = None                     # of each chosen token
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per row: (token, logprob), best first


class Sampler:
    def __init__(self, seed: int | None = None):
        self.generator = torch.Generator()  # for unseeded rows
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SampleResult:
        logits = _apply_penalties(logits.float().cpu(), rows)
        result = SampleResult([])
        if any(r.params.logprobs or r.params.top_logprobs for r in rows):
            result.logprobs, result.top_logprobs = [], []
            logprobs = torch.log_softmax(logits, dim=-1)
        greedy = torch.tensor([r.params.greedy for r in rows])
        tokens = logits.argmax(dim=-1)
        if not greedy.all():
            tokens = torch.where(greedy, tokens, self._sample(logits, rows))
        result.token_ids = tokens.tolist()
        if result.logprobs is not None:
            result.logprobs = logprobs.gather(1, tokens[:, None])[:, 0].tolist()
            k = max(r.params.top_logprobs for r in rows)
            values, ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())
            result.top_logprobs = [list(zip(i[:r.params.top_logprobs].tolist(), v[:r.params.top_logprobs].tolist()))
                                   for r, i, v in zip(rows, ids, values)]
        return result

    def _sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        temps = torch.tensor([r.params.temperature or 1.0 for r in rows])[:, None]
        probs = torch.softmax(_mask_logits(logits / temps, rows), dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, r in enumerate(rows):
            if r.generator is not None:
                noise[i].exponential_(generator=r.generator)
        return (probs / noise).argmax(dim=-1)


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Repetition penalty (HF: divide positive logits, multiply negative ones, for every seen token),
    then presence and frequency penalties over output-token counts."""
    rep = torch.tensor([r.params.repetition_penalty for r in rows])
    pres = torch.tensor([r.params.presence_penalty for r in rows])
    freq = torch.tensor([r.params.frequency_penalty for r in rows])
    if (rep != 1).any():
        seen = _counts(logits.shape, [r.prompt_ids + r.output_ids for r in rows]) > 0
        penalised = torch.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
        logits = torch.where(seen, penalised, logits)
    if (pres != 0).any() or (freq != 0).any():
        counts = _counts(logits.shape, [r.output_ids for r in rows])
        logits = logits - pres[:, None] * (counts > 0) - freq[:, None] * counts
    return logits


def _mask_logits(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """-inf outside each row's top-k, nucleus (top-p) and min-p sets; always keeps the best token."""
    top_k = torch.tensor([r.params.top_k if r.params.top_k > 0 else logits.shape[1] for r in rows])
    top_p = torch.tensor([r.params.top_p for r in rows])
    min_p = torch.tensor([r.params.min_p for r in rows])
    if (top_k < logits.shape[1]).any() or (top_p < 1).any():
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(logits.shape[1])[None, :]
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = (rank >= top_k[:, None]) | (cum - sorted_logits.softmax(dim=-1) >= top_p[:, None])
        drop[:, 0] = False
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    if (min_p > 0).any():
        probs = logits.softmax(dim=-1)
        floor = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def _counts(shape: torch.Size, histories: list[list[int]]) -> torch.Tensor:
    """(rows, vocab) occurrence counts of each row's token ids."""
    counts = torch.zeros(shape)
    width = max((len(h) for h in histories), default=0)
    if width:
        ids = torch.tensor([h + [0] * (width - len(h)) for h in histories])
        present = torch.tensor([[1.0] * len(h) + [0.0] * (width - len(h)) for h in histories])
        counts.scatter_add_(1, ids, present)
    return counts
