"""The options table end to end: each dialect's parser reads every knob its wire has, each adapter writes every
knob its backend has, and a value survives any trip (Ollama -> internal -> Ollama, OpenAI -> internal -> OpenAI,
and across). A knob added to SamplingOptions without a table row, or given a wire name no parser or writer
uses, fails here."""
from __future__ import annotations

from dataclasses import fields

import pytest

from adapters import options
from adapters.engine import sampling_params
from adapters.errors import BadRequest
from adapters.llamacpp import native_sampling
from adapters.ollama import chat_to_wire as ollama_wire
from adapters.openai_wire import chat_to_wire as openai_wire
from adapters.protocol import SamplingOptions
from proxy.dialects import anthropic, ollama, openai, responses

MESSAGES = [{"role": "user", "content": "hi"}]


def sample(knob: options.Knob) -> object:
    """A value valid on every wire, distinct per knob so a crossed mapping shows."""
    if knob.kind is list:
        return ["END", knob.field]
    if knob.kind is bool:
        return True  # a switch's one value that differs from leaving it off
    n = options.KNOBS.index(knob) + 2
    if knob.kind is dict:
        return {str(n): -n / 4}  # token id -> bias, as JSON carries it
    return n if knob.kind is int else round(n / 40, 3)


def every(wire: str) -> dict:
    return {k.name(wire): sample(k) for k in options.KNOBS if k.name(wire)}


def by_field(wire: str, body: dict) -> dict:
    return {k.field: body[k.name(wire)] for k in options.KNOBS if k.name(wire) in body}


def test_every_sampling_field_is_a_knob_or_handled_per_wire():
    assert options.unlisted_fields() == set()
    names = {f.name for f in fields(SamplingOptions)}
    assert all(k.field in names for k in options.KNOBS)


@pytest.mark.parametrize("wire", options.WIRES)
def test_names_are_unique_per_wire(wire):
    listed = [k.name(wire) for k in options.KNOBS if k.name(wire)]
    assert len(listed) == len(set(listed))


def test_ollama_round_trip():
    sent = every("ollama")
    req = ollama.parse_chat({"model": "m", "messages": MESSAGES, "options": sent})
    assert ollama_wire(req)["options"] == sent


def test_openai_round_trip():
    sent = every("openai")
    req = openai.parse_chat({"model": "m", "messages": MESSAGES, **sent})
    body = openai_wire(req)
    assert {k: body[k] for k in sent} == sent


PARSERS = {
    "ollama": lambda sent: ollama.parse_chat({"model": "m", "messages": MESSAGES, "options": sent}),
    "openai": lambda sent: openai.parse_chat({"model": "m", "messages": MESSAGES, **sent}),
    "anthropic": lambda sent: anthropic.parse_messages({"model": "m", "messages": MESSAGES, **sent}).request,
    "responses": lambda sent: responses.parse_request({"model": "m", "input": "hi", **sent}).chat([]),
}


@pytest.mark.parametrize("source", PARSERS)
@pytest.mark.parametrize("target", ["ollama", "openai", "llamacpp", "engine"])
def test_values_cross_between_wires(source, target):
    """Whatever both wires can say arrives with the same value, under the target's name."""
    req = PARSERS[source](every(source))
    written = {"ollama": lambda: ollama_wire(req)["options"], "openai": lambda: openai_wire(req),
               "llamacpp": lambda: native_sampling(req.options),
               "engine": lambda: vars(sampling_params(req.options, 4096))}[target]()
    shared = [k for k in options.KNOBS if k.name(source) and k.name(target)]
    assert shared and all(_as_json(written[k.name(target)]) == sample(k) for k in shared)


def _as_json(value: object) -> object:
    """The engine keeps logit_bias's token ids as integers; JSON, as strings."""
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value


def test_unknown_ollama_options_pass_through_untouched():
    req = ollama.parse_chat({"model": "m", "messages": MESSAGES, "options": {"mirostat": 2, "temperature": 0}})
    assert req.options.extra == {"mirostat": 2}
    assert ollama_wire(req)["options"] == {"mirostat": 2, "temperature": 0.0}


@pytest.mark.parametrize("field, value", [("temperature", 2.5), ("top_p", 1.5), ("presence_penalty", -3)])
def test_openai_ranges_are_enforced_and_ollama_passes_them_on(field, value):
    with pytest.raises(BadRequest, match=field):
        openai.parse_chat({"model": "m", "messages": MESSAGES, field: value})
    req = ollama.parse_chat({"model": "m", "messages": MESSAGES, "options": {field: value}})
    assert getattr(req.options, field) == value


def test_ollama_takes_any_number_for_an_integer_knob_and_openai_does_not():
    """Ollama's Options.FromMap truncates: clients that keep options as floats send `num_ctx: 2048.0` (before, a 400
    "num_predict must be an integer, got float")."""
    req = ollama.parse_chat({"model": "m", "messages": MESSAGES,
                             "options": {"num_predict": 4.0, "num_ctx": 2048.0, "top_k": 2.7, "seed": 7}})
    assert (req.options.max_tokens, req.options.num_ctx, req.options.top_k, req.options.seed) == (4, 2048, 2, 7)
    with pytest.raises(BadRequest, match="max_tokens must be an integer"):
        openai.parse_chat({"model": "m", "messages": MESSAGES, "max_tokens": 4.0})


def test_llama_server_gets_truncations_off_where_the_request_sets_none():
    """llama-server would sample an OpenAI or Anthropic request with its own top_k 40, top_p 0.95, min_p 0.05 (seen
    in its /slots); unset is off there, as on the engine. What a request (or the Ollama dialect) sets goes as set."""
    asked = anthropic.parse_messages({"model": "m", "messages": MESSAGES, "max_tokens": 8}).request
    bare = native_sampling(asked.options)
    assert (bare["top_k"], bare["top_p"], bare["min_p"]) == (0, 1.0, 0.0)
    ollamas = native_sampling(options.under(ollama.parse_chat({"model": "m", "messages": MESSAGES}).options,
                                            options.defaults("ollama")))
    assert (ollamas["top_k"], ollamas["top_p"], ollamas["min_p"]) == (40, 0.9, 0.0)


def test_a_wrong_type_names_the_key():
    with pytest.raises(BadRequest, match="top_k"):
        ollama.parse_chat({"model": "m", "messages": MESSAGES, "options": {"top_k": "many"}})


def test_defaults_per_dialect_and_what_fills_what():
    assert options.defaults("ollama") == SamplingOptions(temperature=0.8, top_p=0.9, top_k=40, min_p=0.0,
                                                         repeat_penalty=1.1, repeat_last_n=64)
    assert options.defaults("openai") == options.defaults("responses") == SamplingOptions(temperature=1.0, top_p=1.0)
    assert options.defaults("anthropic") == SamplingOptions(temperature=1.0)
    mine = SamplingOptions(temperature=0.0, stop=["x"], extra={"mirostat": 2})
    filled = options.under(mine, SamplingOptions(temperature=0.5, top_k=3, stop=["y"], extra={"mirostat": 1, "a": 1}))
    assert (filled.temperature, filled.top_k, filled.stop, filled.extra) == (0.0, 3, ["x"], {"mirostat": 2, "a": 1})


@pytest.mark.parametrize("bias", [{"x": 1}, {"5": 101}, {"-1": 1}, {"5": "high"}, {"5": True}, [1, 2]])
def test_logit_bias_takes_token_ids_and_biases_within_100(bias):
    with pytest.raises(BadRequest, match="logit_bias"):
        openai.parse_chat({"model": "m", "messages": MESSAGES, "logit_bias": bias})
    assert openai.parse_chat({"model": "m", "messages": MESSAGES, "logit_bias": {"5": -100}}).options.logit_bias == {
        5: -100.0}


@pytest.mark.parametrize("parse, body", [
    (ollama.parse_chat, {"options": {"seed": -1, "temperature": 0.7}}),
    (openai.parse_chat, {"seed": -1, "temperature": 0.7}),
    (openai.parse_chat, {"seed": 4294967295, "temperature": 0.7}),  # llama.cpp's LLAMA_DEFAULT_SEED
    (ollama.parse_chat, {"options": {"seed": 4294967295, "temperature": 0.7}}),
])
def test_a_negative_seed_is_a_random_one(parse, body):
    """SillyTavern sends Ollama's default `seed: -1` with every request. Read as a fixed seed, it made each answer
    cacheable and seeded alike, so regenerate gave the same text every time; Ollama and llama-server draw a seed."""
    req = parse({"model": "m", "messages": MESSAGES, **body})
    assert req.options.seed is None and not req.options.deterministic
    assert "seed" not in ollama_wire(req)["options"] and "seed" not in openai_wire(req)


@pytest.mark.parametrize("wire", ["ollama", "openai", "anthropic"])
def test_an_empty_stop_string_stops_nothing(wire):
    """The engine read it so; llama-server ended every answer at its first token on it."""
    name = options.BY_FIELD["stop"].name(wire)
    assert options.read(wire, {name: ["", "END", ""]}).stop == ["END"]
    assert options.read(wire, {name: ""}).stop == []


def test_a_repeat_window_past_any_context_is_bounded_before_the_server_said_its_own():
    """Before /props was asked, an int32's worth went on: a buffer of that many tokens (8 GB) in llama-server."""
    from adapters.llamacpp import llama_reads
    assert llama_reads(SamplingOptions(repeat_last_n=2**31 - 1), None).repeat_last_n == 2**17
    assert llama_reads(SamplingOptions(repeat_last_n=-1), 4096).repeat_last_n == 4096
