"""Every sampling knob once: its `SamplingOptions` field, its type, and its name on each wire.

The dialects read client bodies with `read`, the HTTP adapters write backend bodies with `write`, and the engine
adapter maps onto `SamplingParams` through the `engine` column, so a knob added here reaches every dialect and
every backend, and a knob missing here reaches none (tests/adapters/test_options.py holds both ends).

Wires: "ollama" (the keys of Ollama's `options` object), "openai" (top-level fields of an OpenAI request; `top_k`,
`min_p` and `repetition_penalty` are the extensions vLLM, SGLang and llama-server accept), "anthropic" (Messages
API fields), "responses" (OpenAI Responses API fields), "llamacpp" (llama-server's native `/completion` keys) and
"engine" (`engine.SamplingParams` fields). Log-probabilities are
not knobs of the sampler and differ in shape per wire (a flag, a count, `n_probs`): each dialect handles them.
"""
from __future__ import annotations

import functools
import math

from dataclasses import dataclass, field, fields
from typing import Any

from .copies import replaced
from .errors import BadRequest
from .fields import get, string_list
from .protocol import SamplingOptions

WIRES = ("ollama", "openai", "anthropic", "responses", "llamacpp", "engine")


@dataclass(frozen=True)
class Knob:
    field: str
    kind: type  # int, float, bool, list (of strings) or dict (token id -> bias)
    ollama: str | None = None
    openai: str | None = None
    llamacpp: str | None = None
    engine: str | None = None
    anthropic: str | None = None
    responses: str | None = None
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)  # per wire, as its API documents: 400 outside
    defaults: dict[str, float] = field(default_factory=dict)  # per dialect: what its own server applies when unset

    def name(self, wire: str) -> str | None:
        return getattr(self, wire)


_CHANCE = {"openai": (0, 1), "responses": (0, 1), "anthropic": (0, 1)}  # top_p and the like
_PENALTY = {"openai": (-2, 2)}
# Defaults as each dialect's server applies them: Ollama 0.14.0's api.DefaultOptions (the API level Velo reports;
# Ollama 0.32.10 dropped repeat_penalty to 1.0), min_p 0 overriding llama-server's 0.05; OpenAI's API reference
# (temperature 1, top_p 1, as Ollama's own /v1 sends them; its penalties' 0 is every backend's own default) and
# Anthropic's (temperature 1).
_OPENAI_1 = {"openai": 1.0, "responses": 1.0}
KNOBS: tuple[Knob, ...] = (
    Knob("max_tokens", int, "num_predict", "max_tokens", "n_predict", "max_tokens", "max_tokens", "max_output_tokens"),
    Knob("temperature", float, "temperature", "temperature", "temperature", "temperature", "temperature",
         "temperature", bounds={"openai": (0, 2), "responses": (0, 2), "anthropic": (0, 1)},
         defaults={"ollama": 0.8, "anthropic": 1.0, **_OPENAI_1}),
    Knob("top_p", float, "top_p", "top_p", "top_p", "top_p", "top_p", "top_p", bounds=_CHANCE,
         defaults={"ollama": 0.9, **_OPENAI_1}),
    Knob("top_k", int, "top_k", "top_k", "top_k", "top_k", "top_k", defaults={"ollama": 40}),
    Knob("min_p", float, "min_p", "min_p", "min_p", "min_p", bounds=_CHANCE, defaults={"ollama": 0.0}),
    Knob("typical_p", float, "typical_p", None, "typical_p"),
    Knob("seed", int, "seed", "seed", "seed", "seed"),
    Knob("presence_penalty", float, "presence_penalty", "presence_penalty", "presence_penalty", "presence_penalty",
         bounds=_PENALTY),
    Knob("frequency_penalty", float, "frequency_penalty", "frequency_penalty", "frequency_penalty",
         "frequency_penalty", bounds=_PENALTY),
    Knob("repeat_penalty", float, "repeat_penalty", "repetition_penalty", "repeat_penalty", "repetition_penalty",
         defaults={"ollama": 1.1}),
    Knob("repeat_last_n", int, "repeat_last_n", None, "repeat_last_n", "repeat_last_n", defaults={"ollama": 64}),
    Knob("num_ctx", int, "num_ctx"),
    Knob("stop", list, "stop", "stop", "stop", "stop", "stop_sequences"),
    # OpenAI's logit_bias (token id -> -100..100), which llama-server and vLLM take as it is; Ollama has none.
    Knob("logit_bias", dict, None, "logit_bias", "logit_bias", "logit_bias"),
    # vLLM's, SGLang's and llama-server's extension, which load generators (vLLM's benchmarks, llmperf) send for
    # answers of exactly max_tokens; Ollama has none.
    Knob("ignore_eos", bool, None, "ignore_eos", "ignore_eos", "ignore_eos"),
)
BY_FIELD = {k.field: k for k in KNOBS}
_FIELDS = tuple(BY_FIELD)
# each wire's knobs with their names there, listed once: every request reads one wire and writes another, and the
# knob-by-knob getattr over all six columns was ~150 calls a request
_ON: dict[str, tuple[tuple[Knob, str], ...]] = {
    wire: tuple((k, name) for k in KNOBS if (name := k.name(wire)) is not None) for wire in WIRES}
_NOT_KNOBS = {"logprobs", "top_logprobs", "extra"}  # SamplingOptions fields every wire treats its own way
_UNSET = (None, [], {})  # a knob left to the backend
_MIN_CTX = 4  # the smallest window Ollama loads a model with


def names(wire: str) -> set[str]:
    """The keys `wire` has knobs for."""
    return {name for _, name in _ON[wire]}


def kinds(wire: str) -> dict[str, type]:
    """The keys `wire` has knobs for, with the knob's type."""
    return {name: knob.kind for knob, name in _ON[wire]}


# llama.cpp's "draw a seed" (common.h, LLAMA_DEFAULT_SEED 0xFFFFFFFF), which Ollama's runner passes on as such
_LLAMA_DEFAULT_SEED = 0xFFFFFFFF


def read(wire: str, raw: dict[str, Any], *, cut_fractions: bool = False) -> SamplingOptions:
    """The knobs `raw` (a client's body or options object) sets, type-checked; a value outside the range the
    wire's API documents is a 400 naming the field. `cut_fractions`: an integer knob takes any number (`_whole`).
    An empty stop string stops nothing (the engine's reading): llama-server ended every answer at once on it."""
    opts = SamplingOptions()
    for knob, name in _ON[wire]:
        if name not in raw:
            continue
        value = [s for s in string_list(raw, name) if s] if knob.kind is list \
            else _biases(raw, name) if knob.kind is dict \
            else _whole(raw, name) if knob.kind is int and cut_fractions else get(raw, name, knob.kind)
        if wire in knob.bounds and value is not None:
            lo, hi = knob.bounds[wire]
            if not lo <= value <= hi:
                raise BadRequest(f"{name} must be between {lo:g} and {hi:g}, got {value}", param=name)
        if knob.field == "seed" and value is not None and (value < 0 or value == _LLAMA_DEFAULT_SEED):
            value = None  # a random seed: Ollama's default -1 (api/types.go), llama-server's LLAMA_DEFAULT_SEED
        setattr(opts, knob.field, value)
    return opts


def num_ctx(asked: int | None) -> int | None:
    """A client's num_ctx as Ollama loads a model with it: at least 4 (server/sched.go), where 1-3 left a window
    too small to keep any room for the answer, and a negative one was "a window of -1 tokens"; 0 asks for none."""
    return max(asked, _MIN_CTX) if asked else None


def _whole(raw: dict[str, Any], name: str) -> int | None:
    """An integer knob as Ollama's API reads one (api/types.go Options.FromMap): any JSON number, a fraction cut
    off, so `num_ctx: 2048.0` is 2048 (clients that keep options as floats send it so), and null unset, as FromMap
    skips it (it was a 500). Config files stay strict, as a Modelfile's PARAMETER is."""
    value = raw[name]
    if value is None:
        return None
    whole = int(value) if isinstance(value, float) and math.isfinite(value) else get(raw, name, int)
    if not -2**63 <= whole < 2**63:  # 1e300 went on as an integer no JSON writer here takes: a 500
        raise BadRequest(f"{name}: {value:g} is out of range", param=name)
    return whole


def write(wire: str, opts: SamplingOptions) -> dict[str, Any]:
    """The knobs `opts` sets, under `wire`'s names (knobs the wire lacks are left out)."""
    out: dict[str, Any] = {}
    values = vars(opts)
    for knob, name in _ON[wire]:
        if (value := values[knob.field]) not in _UNSET:
            out[name] = _on_wire(knob, wire, value)
    return out


def as_llama_reads(knobs: dict[str, Any]) -> dict[str, Any]:
    """Knobs (by the engine's names, which the OpenAI wire shares for these four) outside the ranges the engine, vLLM
    and SGLang take, as llama.cpp's sampler reads them (Ollama passes any value to it, and so does its dialect; OpenAI
    takes a top_p of 0, which vLLM and SGLang answered with a 400): a temperature below 0, a top_p at or below 0 or a
    min_p above 1 keeps only the likeliest token (greedy); a top_p above 1 or a min_p below 0 is off. A repeat penalty
    at or below 0 is off too: llama.cpp divides by it (a seen token's logit became +inf, and every logprob NaN), and
    Ollama's own engine has no repeat penalty, so such a client meant "none"."""
    t, p, m, r = knobs.get("temperature"), knobs.get("top_p"), knobs.get("min_p"), knobs.get("repetition_penalty")
    if r is not None and r <= 0:
        knobs["repetition_penalty"] = 1.0
    if (t is not None and t < 0) or (p is not None and p <= 0) or (m is not None and m > 1):
        knobs["temperature"] = 0.0
    if p is not None and not 0 < p <= 1:
        knobs["top_p"] = 1.0
    if m is not None and not 0 <= m <= 1:
        knobs["min_p"] = 0.0
    return knobs


def _on_wire(knob: Knob, wire: str, value: Any) -> Any:
    if knob.kind is list:
        return list(value)
    if knob.kind is dict and wire != "engine":
        return {str(token): bias for token, bias in value.items()}  # JSON's keys are strings
    return value


@functools.cache
def defaults(dialect: str) -> SamplingOptions:
    """What `dialect`'s own server samples with when a request leaves a knob unset: one value per dialect, shared by
    every request, so only read (`under` copies)."""
    return SamplingOptions(**{k.field: k.kind(k.defaults[dialect]) for k in KNOBS if dialect in k.defaults})


def under(opts: SamplingOptions, base: SamplingOptions) -> SamplingOptions:
    """`opts`, with what it leaves unset taken from `base` (a preset's parameters, a model's config, defaults);
    `opts` itself when `base` fills nothing (every request passes here, and a copy is 3 µs of its ~550)."""
    mine, given = vars(opts), vars(base)
    filled = {f: value for f in _FIELDS if (value := given[f]) not in _UNSET and mine[f] in _UNSET}
    if not filled and not base.extra.keys() - opts.extra.keys():
        return opts
    return replaced(opts, **filled, extra=base.extra | opts.extra)


_BIAS = 100  # OpenAI's bound: -100 bans a token, 100 makes it the only choice


def _biases(raw: dict[str, Any], name: str) -> dict[int, float]:
    """`{"token id": bias}`, ids as strings (JSON's keys), biases from -100 to 100."""
    value = get(raw, name, dict, {})
    try:
        out = {int(token): float(bias) for token, bias in value.items()
               if not isinstance(bias, bool) and isinstance(bias, (int, float))}
    except ValueError:
        out = {}
    if len(out) != len(value) or any(t < 0 or abs(b) > _BIAS for t, b in out.items()):
        raise BadRequest(f"{name} must map token ids to numbers from -{_BIAS} to {_BIAS}", param=name)
    return out


def unlisted_fields() -> set[str]:
    """SamplingOptions fields that are neither a knob here nor handled per wire: must stay empty (a test checks)."""
    return {f.name for f in fields(SamplingOptions)} - BY_FIELD.keys() - _NOT_KNOBS
