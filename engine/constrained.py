"""Schema-constrained decoding: every step masks the tokens that could not continue a valid output.

Built on llguidance (Microsoft's Rust grammar engine behind Guidance, also used by llama.cpp, vLLM and
SGLang): it compiles JSON Schema and Lark grammars lazily against the tokenizer's byte-level vocabulary
and computes a step's token mask in tens of microseconds, with no torch or transformers dependency.
A request carries its grammar as a string (`grammar_for` builds it from an Ollama `format`, an OpenAI
`response_format` or a tool list); the engine keeps one `LLMatcher` per constrained sequence.
"""

from __future__ import annotations

import json
import re
import llguidance
import torch

from engine.tokenizer import Tokenizer
from engine.tool_schema import tool_call_schema

# Compact, fixed whitespace: small models given free whitespace can pad forever. `lenient` ignores
# schema keywords llguidance does not implement instead of rejecting the request.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


def json_grammar(schema: dict | None) -> str:
    """Grammar for one JSON value matching schema; None means any JSON object (Ollama `format: "json"`)."""
    return llguidance.LLMatcher.grammar_from_json_schema(schema or {"type": "object"}, defaults=JSON_OPTIONS)


def grammar_for(format: str | dict | None = None, tools: list[dict] | None = None,
                tool_choice: str | dict | None = None) -> str | None:
    """The grammar a request's output must match, or None for free text; ValueError if a schema is invalid.

    format: None, "json" or a JSON Schema. tools: [{"name", "parameters"}]; tool_choice "none" ignores
    them, "required" or {"function": {"name"}} forces a call, anything else ("auto") allows either a
    call or an answer: JSON matching format if given, else free text that does not start with "{" and in
    which every `<tool_call>` the model opens (Hermes / Qwen format) must hold a valid call and close."""
    grammar = _grammar(format, tools, tool_choice)
    if grammar is not None:
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if failed:
            raise ValueError(f"invalid output grammar: {_headline(messages[0])}")
    return grammar


_AT = re.compile(r"^at \d+\(\d+\): ")  # llguidance's line(column) in the grammar


def _headline(message: str) -> str:
    """llguidance's error without the place in Velo's grammar and the grammar's lines after it, which mean nothing
    to a client whose tool schema (`"required": {}`) or format was the mistake. A regex's error is its first line
    ("regex parse error:"), the pattern, a line of carets and the reason: the pattern and the reason are kept."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    head = lines[0] if lines else message
    if head.endswith(":") and len(lines) > 1:
        head = " ".join([head, *(line for line in lines[1:] if set(line) != {"^"})])
    return _AT.sub("", head, count=1)


def _grammar(format, tools, tool_choice) -> str | None:
    if not tools or tool_choice == "none":
        return None if format is None else json_grammar(None if format == "json" else format)
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or tool_choice).get("name")
        tools = [t for t in tools if t["name"] == name] or tools
    call = tool_call_schema(tools)
    if tool_choice == "required" or isinstance(tool_choice, dict):
        return json_grammar(call)
    if format is not None:
        answer = _lark_json(format if isinstance(format, dict) else {"type": "object"})
        return llguidance.LLMatcher.grammar_from_lark(f"start: answer | call\nanswer: {answer}\ncall: {_lark_json(call)}\n")
    return llguidance.LLMatcher.grammar_from_lark(_LAZY_CALLS.format(call=_lark_json(call)))


# Free text until the model writes "<tool_call>" (a lazy lexeme: it ends at the first one), then a valid call and
# "</tool_call>", any number of times; or one bare call. Free text may not start with "{": a model that opens a
# JSON object makes a call.
_LAZY_CALLS = """start: call | tagged* TEXT
call: {call}
tagged: tagged_hd /\\s*/ call /\\s*/ "</tool_call>"
tagged_hd[lazy]: ANY "<tool_call>"
ANY: /([^{{](.|\\n)*)?/
TEXT: /\\s*([^{{\\s](.|\\n)*)?/
"""


def _lark_json(schema: dict) -> str:
    return "%json " + json.dumps(schema | {"x-guidance": JSON_OPTIONS})


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
            raise ValueError(f"invalid output grammar: {_headline(m.get_error())}")
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
