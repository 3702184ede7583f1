"""Schema-constrained decoding: every step masks the tokens that could not continue a valid output.

Built on llguidance (Microsoft's Rust grammar engine behind Guidance, also used by llama.cpp, vLLM and
SGLang): it compiles JSON Schema and Lark grammars lazily against the tokenizer's byte-level vocabulary
and computes a step's token mask in tens of microseconds, with no torch or transformers dependency.
A request carries its grammar as a string (engine/grammar.py builds it from an Ollama `format`, an OpenAI
`response_format` or a tool list); the engine keeps one `LLMatcher` per constrained sequence.
"""

from __future__ import annotations

import llguidance
import torch

from engine.grammar import headline
from engine.tokenizer import Tokenizer


class Constrainer:
    """Per engine: the llguidance view of the tokenizer (built once, ~0.3 s) and batched masking."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self.vocab_size = vocab_size  # the model's; may exceed the tokenizer's (padded embeddings)
        self.eos = list(tokenizer.eos_token_ids)
        self.ll = llguidance.LLTokenizer(tokenizer.tk.to_str(), n_vocab=max(vocab_size, tokenizer.vocab_size),
                                         eos_token=self.eos)
        self.executor = llguidance.LLExecutor()
        self._bits = torch.arange(32, dtype=torch.int32)

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher; ValueError (with llguidance's message) if the grammar or schema is invalid."""
        m = llguidance.LLMatcher(self.ll, grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"invalid output grammar: {headline(m.get_error())}")
        return m

    def allowed(self, matchers: list[llguidance.LLMatcher]) -> torch.Tensor:
        """(len(matchers), vocab) bool: tokens each matcher accepts next. A matcher that can accept
        nothing (it errored) allows the end-of-sequence tokens, so the request ends instead of failing."""
        words = (self.ll.vocab_size + 31) // 32
        bitmask = torch.zeros(len(matchers), words, dtype=torch.int32)
        self.executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.data_ptr(),
                                              words * 4, len(matchers))
        allowed = ((bitmask[:, :, None] >> self._bits) & 1).bool().view(len(matchers), -1)[:, :self.vocab_size]
        stuck = ~allowed.any(dim=1)
        if stuck.any():
            allowed[stuck.nonzero()[:, 0][:, None], torch.tensor(self.eos)[None, :]] = True
        return allowed

    def mask(self, logits: torch.Tensor, matchers: list[llguidance.LLMatcher | None]) -> torch.Tensor:
        """logits with -inf on the tokens each row's matcher forbids (rows without one untouched)."""
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return logits
        logits = logits.clone()
        allowed = self.allowed([matchers[i] for i in rows]).to(logits.device)
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
        return logits

    @staticmethod
    def advance(matcher: llguidance.LLMatcher, token: int) -> None:
        """Feed the sampled token; a masked step only samples allowed ones, so this cannot fail."""
        matcher.consume_token(token)
