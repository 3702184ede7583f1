"""Turn a batch of logits into next tokens, each row with its own sampling knobs, in a few tensor ops on the logits'
device (on CUDA no row of logits is copied to the CPU; only the chosen tokens come back).

Order (as in vLLM): penalties on raw logits -> logprobs are taken here (the model's distribution after
penalties, before temperature) -> temperature -> top-k, then top-p, then min-p -> sample. Random rows use
the exponential race (`argmax(p / E)`, E ~ Exp(1)), so a seeded request draws its noise from its own
`torch.Generator` and gets the same tokens whatever else shares the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


_GREEDY_BELOW = 1e-5
# Penalties past these act as infinite ones already (logits are tens), and stay finite in float32: 1e39 became
# inf there, and inf * 0 (an unseen token's count) NaN.
_PENALTY_CAP = 1e4
_REPETITION_RANGE = (1e-4, 1e4)


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0       # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0                 # 0 or -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # >1 discourages any token among the last `repeat_last_n` of prompt + output
    repeat_last_n: int = -1          # as Ollama: -1 the whole history, 0 none (the penalty is off)
    presence_penalty: float = 0.0    # OpenAI-style, on output tokens only
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: str | None = None     # output must match it (engine.grammar.grammar_for builds one)
    logit_bias: dict[int, float] = field(default_factory=dict)  # added to these tokens' logits, before penalties

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p <= 1 \
                or self.repetition_penalty <= 0:
            raise ValueError(f"invalid sampling parameters: {self}")

    @property
    def greedy(self) -> bool:
        """Below vLLM's 1e-5 (its _SAMPLING_EPS) a temperature is greedy: 1e-50 was 0 in float32, and 1e-40 made
        `logits / T` infinite, so a row's probabilities were NaN (token 0 each step, or a failed batch)."""
        return self.temperature < _GREEDY_BELOW


@dataclass
class SampleRow:
    """One row of the batch: its knobs, its history (for penalties) and its generator (if seeded)."""
    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None = None


@dataclass
class Sample:
    """One sequence's result of a step: its new tokens (one, or the kept drafts plus the target's own after
    verification) and, where logprobs were asked for, the chosen token's and the best alternatives."""
    tokens: list[int]
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None  # (token, logprob), best first


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None = None                     # of each chosen token
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per row: (token, logprob), best first

    def sample(self, row: int) -> Sample:
        if self.logprobs is None:
            return Sample([self.token_ids[row]])
        return Sample([self.token_ids[row]], self.logprobs[row], self.top_logprobs[row])


class Sampler:
    def __init__(self, seed: int | None = None):
        self.generator = torch.Generator()  # for unseeded rows
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()
        self._device_generators: dict[torch.device, torch.Generator] = {}

    def generator_for(self, device: torch.device) -> torch.Generator:
        """The unseeded rows' generator on device: CPU's own, or one seeded from it once per GPU."""
        if device.type == "cpu":
            return self.generator
        if device not in self._device_generators:
            gen = torch.Generator(device)
            gen.manual_seed(int(torch.randint(2**62, (1,), generator=self.generator)))
            self._device_generators[device] = gen
        return self._device_generators[device]

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SampleResult:
        if all(_plain_greedy(r.params) for r in rows):  # argmax where the logits are: no full rows to the CPU
            return SampleResult(logits.argmax(dim=-1).tolist())
        logits = _apply_penalties(logits.float(), rows)
        result = SampleResult([])
        if any(r.params.logprobs or r.params.top_logprobs for r in rows):
            result.logprobs, result.top_logprobs = [], []
            logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
        if random_rows:
            index = torch.tensor(random_rows, device=logits.device)
            tokens[index] = self._sample(logits.index_select(0, index), [rows[i] for i in random_rows])
        result.token_ids = tokens.tolist()
        if result.logprobs is not None:
            result.logprobs = logprobs.gather(1, tokens[:, None])[:, 0].tolist()
            k = max(r.params.top_logprobs for r in rows)
            values, ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())
            # a token at -inf (a grammar's or logit_bias's forbidden one) is no candidate; JSON would write it null
            result.top_logprobs = [[(t, lp) for t, lp in zip(i[:r.params.top_logprobs].tolist(),
                                                             v[:r.params.top_logprobs].tolist()) if lp != -math.inf]
                                   for r, i, v in zip(rows, ids, values)]
        return result

    def _sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """Draw from each row's filtered distribution. Rows with top-k/top-p/min-p work on their best
        candidates only (a top-k of 40 never sorts the whole vocabulary); which path a row takes depends
        on its own knobs alone, so a seeded row draws the same token whatever shares the batch."""
        logits = logits / _temperatures(rows, logits.device)
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        filtered = [_filters(r.params) for r in rows]
        for use_filters in (False, True):
            part = [i for i, f in enumerate(filtered) if f == use_filters]
            if not part:
                continue
            index, sub = torch.tensor(part, device=logits.device), [rows[i] for i in part]
            if use_filters:
                values, ids = _candidates(logits.index_select(0, index), sub)
                choice = self._race(values, sub, _widths(sub, logits.shape[1]))
                tokens[index] = ids.gather(1, choice[:, None])[:, 0]
            else:
                tokens[index] = self._race(logits.index_select(0, index), sub, [logits.shape[1]] * len(sub))
        return tokens

    def _race(self, logits: torch.Tensor, rows: list[SampleRow], widths: list[int]) -> torch.Tensor:
        """A draw from softmax(logits) per row as argmax(p / E), E ~ Exp(1); a seeded row's first
        `width` noise values come from its own generator (a CPU one: on a GPU, that row's noise is drawn on the CPU
        and copied, so a seed gives the same tokens on either device)."""
        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=self.generator_for(probs.device))
        for i, (r, width) in enumerate(zip(rows, widths)):
            if r.generator is not None:
                noise[i, :width] = torch.empty(width).exponential_(generator=r.generator).to(probs.device)
        return (probs / noise).argmax(dim=-1)


def probabilities(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Each row's sampling distribution: temperature, then its top-k / top-p / min-p masks."""
    return torch.softmax(_mask_logits(logits / _temperatures(rows, logits.device), rows), dim=-1)


def _temperatures(rows: list[SampleRow], device: torch.device) -> torch.Tensor:
    """(rows, 1): each row's temperature, 1 for a greedy row (its argmax is taken apart)."""
    return torch.tensor([1.0 if r.params.greedy else r.params.temperature for r in rows], device=device)[:, None]


def _plain_greedy(p: SamplingParams) -> bool:
    """Greedy with no penalty to apply and no logprobs to report: the argmax is the whole answer."""
    return p.greedy and not (p.logprobs or p.top_logprobs or p.logit_bias) and p.repetition_penalty == 1 \
        and p.presence_penalty == 0 and p.frequency_penalty == 0


def _filters(p: SamplingParams) -> bool:
    return p.top_k > 0 or p.top_p < 1 or p.min_p > 0


def _widths(rows: list[SampleRow], vocab: int) -> list[int]:
    """How many candidates each row keeps before top-p/min-p: its top-k, else the whole vocabulary."""
    return [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows]


def _candidates(logits: torch.Tensor, rows: list[SampleRow]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's logits best first, (rows, k) with k the widest top-k asked for, -inf where top-k, then
    top-p (over what top-k kept) and then min-p drop a token; and the token ids. The best token always stays."""
    widths, device = _widths(rows, logits.shape[1]), logits.device
    values, ids = logits.topk(max(widths), dim=-1)
    rank = torch.arange(values.shape[1], device=device)[None, :]
    values = values.masked_fill(rank >= torch.tensor(widths, device=device)[:, None], float("-inf"))
    top_p = torch.tensor([r.params.top_p for r in rows], device=device)[:, None]
    if any(r.params.top_p < 1 for r in rows):
        probs = values.softmax(dim=-1)
        values = values.masked_fill((probs.cumsum(dim=-1) - probs >= top_p) & (rank > 0), float("-inf"))
    min_p = torch.tensor([r.params.min_p for r in rows], device=device)[:, None]
    if any(r.params.min_p > 0 for r in rows):
        probs = values.softmax(dim=-1)
        values = values.masked_fill(probs < min_p * probs[:, :1], float("-inf"))
    return values, ids


def _mask_logits(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Full-vocabulary logits, -inf outside each row's top-k / top-p / min-p set (see `_candidates`)."""
    if not any(_filters(r.params) for r in rows):
        return logits
    values, ids = _candidates(logits, rows)
    return torch.full_like(logits, float("-inf")).scatter(1, ids, values)


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Logit bias, then repetition penalty (HF: divide positive logits, multiply negative ones, for every seen
    token), then presence and frequency penalties over output-token counts."""
    if any(r.params.logit_bias for r in rows):  # OpenAI's: on the raw logits; ids past the vocabulary ignored
        logits = logits.clone()  # `.float()` of float logits is the model's own tensor
        for i, r in enumerate(rows):
            ids = [t for t in r.params.logit_bias if t < logits.shape[1]]
            logits[i, ids] += torch.tensor([r.params.logit_bias[t] for t in ids], device=logits.device)
    device = logits.device
    rep = torch.tensor([r.params.repetition_penalty for r in rows], device=device).clamp(*_REPETITION_RANGE)
    pres = torch.tensor([r.params.presence_penalty for r in rows], device=device).clamp(-_PENALTY_CAP, _PENALTY_CAP)
    freq = torch.tensor([r.params.frequency_penalty for r in rows], device=device).clamp(-_PENALTY_CAP, _PENALTY_CAP)
    if any(r.params.repetition_penalty != 1 for r in rows):
        seen = _counts(logits.shape, [_window(r) for r in rows], device) > 0
        penalised = torch.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
        logits = torch.where(seen, penalised, logits)
    if any(r.params.presence_penalty != 0 or r.params.frequency_penalty != 0 for r in rows):
        counts = _counts(logits.shape, [r.output_ids for r in rows], device)
        logits = logits - pres[:, None] * (counts > 0) - freq[:, None] * counts
    return logits


def _window(row: SampleRow) -> list[int]:
    """The tokens the repetition penalty looks at: the last `repeat_last_n` of prompt + output."""
    n = row.params.repeat_last_n
    if n < 0:
        return row.prompt_ids + row.output_ids
    return (row.prompt_ids[-n:] + row.output_ids)[-n:] if n else []


def _counts(shape: torch.Size, histories: list[list[int]], device: torch.device) -> torch.Tensor:
    """(rows, vocab) occurrence counts of each row's token ids."""
    counts = torch.zeros(shape, device=device)
    width = max((len(h) for h in histories), default=0)
    if width:
        ids = torch.tensor([h + [0] * (width - len(h)) for h in histories], device=device)
        present = torch.tensor([[1.0] * len(h) + [0.0] * (width - len(h)) for h in histories], device=device)
        counts.scatter_add_(1, ids, present)
    return counts
