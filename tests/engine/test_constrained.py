"""Constrained decoding: grammars from formats and tools, token masks, and engine outputs that always validate."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from tokenizers.pre_tokenizers import ByteLevel

from engine.constrained import Constrainer, grammar_for
from engine.tokenizer import Tokenizer

WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "additionalProperties": False,
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    """Byte-level BPE with merges, so tokens span several JSON characters ('{"', '": ', ...)."""
    tk = HFTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = [CALL, '{"zone": "UTC", "a": [1, 2.5, -3e2], "ok": true, "none": null}', "Sure, here you go."] * 20
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, initial_alphabet=ByteLevel.alphabet(),
                                                        special_tokens=["<|im_end|>"]))
    return Tokenizer(tk, None, None, "<|im_end|>", [tk.token_to_id("<|im_end|>")])


def accepts(constrainer: Constrainer, grammar: str, text: str) -> bool:
    """Whether text, tokenized, is a complete output of grammar."""
    m = constrainer.matcher(grammar)
    ids = constrainer.ll.tokenize_str(text)
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


@pytest.mark.parametrize("kwargs, good, bad", [
    ({"format": "json"}, ['{"a": [1, 2]}', "{}"], ["[1]", '{"a":1}', "hello"]),
    ({"format": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}},
     ['{"n": 3}'], ['{"n": 3.5}', "{}"]),
    ({"tools": [WEATHER, TIME], "tool_choice": "required"},
     [CALL, '{"name": "get_time", "arguments": {}}'], ["Sure", '{"name": "get_weather", "arguments": {}}']),
    ({"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     ['{"name": "get_time", "arguments": {"zone": "UTC"}}'], [CALL]),
    ({"tools": [WEATHER]}, [CALL, "Sure, here you go."], ['{"zone": 1}', '{"name": "get_time", "arguments": {}}']),
    ({"tools": [WEATHER], "format": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
     [CALL, '{"ok": true}'], ["Sure", '{"ok": 1}']),
])
def test_grammar_for_accepts_exactly_the_valid_outputs(bpe, kwargs, good, bad):
    c = Constrainer(bpe, bpe.vocab_size)
    grammar = grammar_for(**kwargs)
    assert all(accepts(c, grammar, text) for text in good)
    assert not any(accepts(c, grammar, text) for text in bad)


def test_no_format_and_no_tools_means_free_text():
    assert grammar_for() is None and grammar_for(tools=[WEATHER], tool_choice="none") is None


def test_invalid_schema_is_a_value_error(bpe):
    with pytest.raises(ValueError, match="invalid output grammar"):
        Constrainer(bpe, bpe.vocab_size).matcher(grammar_for({"type": "bogus"}))


def test_masked_greedy_decoding_from_noise_builds_a_valid_call(bpe):
    """Random logits, masked each step, then argmax: the result is a complete, schema-valid call. Rows
    without a matcher keep their logits; padded vocabulary beyond the tokenizer is always masked."""
    c = Constrainer(bpe, bpe.vocab_size + 8)
    m = c.matcher(grammar_for(tools=[WEATHER], tool_choice="required"))
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(200):
        logits = torch.randn(2, bpe.vocab_size + 8, generator=g)
        masked = c.mask(logits, [None, m])
        assert torch.equal(masked[0], logits[0]) and torch.isinf(masked[1, bpe.vocab_size:]).all()
        token = int(masked[1].argmax())
        if token in bpe.eos_token_ids:
            break
        c.advance(m, token)
        out.append(token)
    call = json.loads(bpe.decode(out))
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], WEATHER["parameters"])
