"""Constrained decoding: grammars from formats and tools, token masks, and engine outputs that always validate."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from tokenizers.pre_tokenizers import ByteLevel

from engine import SamplingParams
from engine.constrained import Constrainer
from engine.grammar import grammar_for
from engine.speculative import SpeculativeConfig
from engine.tokenizer import Tokenizer
from tests.engine.conftest import collect, generate, submit, text_of, tokens_of

WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "additionalProperties": False,
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
# pydantic's shape for an Enum argument: the same def name in two tools, meaning two things
FORECAST = {"name": "forecast", "parameters": {"$defs": {"Unit": {"enum": ["C", "F"]}}, "type": "object",
                                               "properties": {"unit": {"$ref": "#/$defs/Unit"}}}}
MEASURE = {"name": "measure", "parameters": {"definitions": {"Unit": {"enum": ["cm", "in"]}}, "type": "object",
                                             "properties": {"unit": {"$ref": "#/definitions/Unit"}}}}


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
    ({"tools": [WEATHER]}, [CALL, "Sure, here you go.", "\nSure", "",
                            f"Sure.<tool_call>\n{CALL}\n</tool_call>", f"<tool_call>{CALL}</tool_call>\n<tool_call>\n"
                            f"{CALL}\n</tool_call>\nDone.", "I will use <tool"],
     ['{"zone": 1}', '{"name": "get_time", "arguments": {}}', ' {"a": 1}', "Sure.<tool_call>\nhello",
      f"<tool_call>\n{CALL}", '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>']),
    ({"tools": [WEATHER], "format": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
     [CALL, '{"ok": true}'], ["Sure", '{"ok": 1}']),
    ({"tools": [FORECAST, MEASURE], "tool_choice": "required"},
     ['{"name": "forecast", "arguments": {"unit": "C"}}', '{"name": "measure", "arguments": {"unit": "in"}}'],
     ['{"name": "forecast", "arguments": {"unit": "cm"}}', '{"name": "measure", "arguments": {"unit": "F"}}']),
    ({"tools": [FORECAST, MEASURE]}, ['{"name": "forecast", "arguments": {"unit": "F"}}', "Sure."],
     ['{"name": "measure", "arguments": {"unit": "C"}}']),
])
def test_grammar_for_accepts_exactly_the_valid_outputs(bpe, kwargs, good, bad):
    c = Constrainer(bpe, bpe.vocab_size)
    grammar = grammar_for(**kwargs)
    assert all(accepts(c, grammar, text) for text in good)
    assert not any(accepts(c, grammar, text) for text in bad)


BOUNDED = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "maximum": 2**70}}}


@pytest.mark.parametrize("kwargs", [{"format": BOUNDED}, {"tools": [{"name": "f", "parameters": BOUNDED}],
                                                         "tool_choice": "required"}])
def test_a_bound_past_64_bits_compiles(bpe, kwargs):
    """Client schemas keep such integers whole (adapters/exact_json.py); llguidance takes a dict's integers within
    64 bits only ("Value is not JSON serializable": a tool's 400 on the engine alone)."""
    grammar = grammar_for(**kwargs)
    text = '{"n": 3}' if "format" in kwargs else '{"name": "f", "arguments": {"n": 3}}'
    assert accepts(Constrainer(bpe, bpe.vocab_size), grammar, text)


def test_no_format_and_no_tools_means_free_text():
    assert grammar_for() is None and grammar_for(tools=[WEATHER], tool_choice="none") is None


@pytest.mark.parametrize("schema", [{"type": "bogus"}, {"properties": {"a": {"type": 5}}}, {"minimum": "x"}])
def test_invalid_schema_is_a_value_error(schema):
    with pytest.raises(ValueError, match="invalid output grammar"):
        grammar_for(schema)


def test_an_invalid_tool_schema_is_named_without_velos_grammar():
    """A tool's `"required": {}` is the client's mistake: the message says what, not where in Velo's grammar."""
    with pytest.raises(ValueError) as e:
        grammar_for(tools=[{"name": "f", "parameters": {"type": "object", "required": {}}}])
    assert str(e.value) == \
        "invalid output grammar: failed to compile JSON schema: Expected array for 'required', got {}"


def test_an_invalid_pattern_is_named_with_its_reason():
    """The regex's error came as its first line alone: "regex parse error:", and nothing after it."""
    with pytest.raises(ValueError) as e:
        grammar_for({"type": "object", "properties": {"a": {"type": "string", "pattern": "a(b"}}})
    assert str(e.value) == "invalid output grammar: regex parse error: a(b error: unclosed group"


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


# -- in the engine ----------------------------------------------------------------------------

SCHEMAS = {
    "nested": {"type": "object", "additionalProperties": False, "required": ["user", "tags"],
               "properties": {"user": {"type": "object", "additionalProperties": False, "required": ["name", "age"],
                                       "properties": {"name": {"type": "string", "maxLength": 6},
                                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}}},
                              "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 4}}}},
    "enum-and-numbers": {"type": "object", "additionalProperties": False, "required": ["unit", "value", "ok"],
                         "properties": {"unit": {"enum": ["C", "F", "K"]}, "value": {"type": "number"},
                                        "ok": {"type": "boolean"}}},
    "array-of-objects": {"type": "array", "minItems": 1, "maxItems": 3,
                         "items": {"type": "object", "additionalProperties": False, "required": ["id"],
                                   "properties": {"id": {"type": "integer"}, "note": {"type": ["string", "null"],
                                                                                     "maxLength": 5}}}},
    "optional-fields": {"type": "object", "additionalProperties": False,
                        "properties": {"a": {"type": "integer"}, "b": {"enum": [1, "two", None]}}},
}


@pytest.mark.parametrize("name", SCHEMAS)
def test_engine_outputs_always_validate(tiny_llama, engine_factory, name):
    """Greedy and 12 seeded samples of a random model, batched with an unconstrained request and, where
    eligible, speculative decoding: every constrained output parses, validates and ended by itself."""
    schema = SCHEMAS[name]
    eng = engine_factory(tiny_llama, speculative=SpeculativeConfig("ngram", 3, ngram_min=1))
    prompt = eng.tokenizer.encode("Reply in JSON.")
    grammar = grammar_for(schema)
    params = [SamplingParams(max_tokens=300, temperature=0, grammar=grammar)] + \
             [SamplingParams(max_tokens=300, temperature=1.0, seed=s, grammar=grammar) for s in range(12)]
    free = submit(eng, prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[1]
    queues = [submit(eng, prompt, p)[1] for p in params]
    for q in queues:
        outputs = collect(q)
        assert outputs[-1].finish_reason == "stop"
        jsonschema.validate(json.loads(text_of(outputs)), schema)
    assert len(tokens_of(collect(free))) == 40  # the unconstrained neighbour was not masked


def test_engine_forced_tool_call_parses_and_matches_parameters(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama)
    short = {"type": "string", "maxLength": 8}  # a random model never closes an unbounded string
    tools = [WEATHER | {"parameters": WEATHER["parameters"] | {"properties": {
        "city": short, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}},
             {"name": "get_time", "parameters": {"type": "object", "additionalProperties": False,
                                                 "properties": {"zone": short}}}]
    grammar = grammar_for(tools=tools, tool_choice="required")
    for seed in range(6):
        out = generate(eng, [1, 2, 3], SamplingParams(max_tokens=200, seed=seed, grammar=grammar))
        assert out[-1].finish_reason == "stop"
        call = json.loads(text_of(out))
        tool = next(t for t in tools if t["name"] == call["name"])
        jsonschema.validate(call["arguments"], tool["parameters"])


def test_engine_rejects_an_invalid_grammar_at_submission(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama)
    with pytest.raises(ValueError, match="invalid output grammar"):
        submit(eng, [1, 2], SamplingParams(grammar="start: %json {"))
