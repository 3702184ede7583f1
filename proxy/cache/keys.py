"""Canonical form of a request and the keys derived from it.

The key is computed from the internal model, never from the wire body, so a request parsed from the Ollama
dialect and the same request parsed from the OpenAI dialect hit the same entry. Transport fields (`stream`,
`keep_alive`) are dropped: they never change what the model writes; tool-call ids are kept only as which call a
result answers. A history call's arguments text (ToolCall.text, where a client sent one) is kept: it is what the
backend reads, so two spellings of one call are two prompts.
"""
from __future__ import annotations

import functools
from dataclasses import MISSING, fields, is_dataclass
from typing import Any

import xxhash

from adapters.exact_json import dumps
from adapters.options import KNOBS
from adapters.protocol import ChatRequest, CompletionRequest, Message, SamplingOptions

Request = ChatRequest | CompletionRequest

# `parallel_tool_calls` is applied above the cache (stages/one_call.py): one entry answers both settings.
# `prefix_scope` is the caller's, which the cache's own scope already is.
_TRANSPORT = {"stream", "keep_alive", "parallel_tool_calls", "prefix_scope"}
_IDS = {"id", "tool_call_id"}
# Ollama `options` that tune speed or memory, not the text written (`num_keep` is not one: it decides which tokens
# a context shift keeps).
_PERFORMANCE_KNOBS = {"num_thread", "num_gpu", "main_gpu", "num_batch", "use_mmap", "use_mlock", "low_vram", "numa"}
_FLOAT_OPTIONS = {k.field for k in KNOBS if k.kind is float}


def _plain(value: Any) -> Any:
    """Dataclasses -> dicts without the fields that are None, "" or their own default, so a field left out and one
    set to its default agree. Only a field's own default is dropped: `format = {}` (any JSON, a grammar on the
    backend) dropped as "empty" shared its entry with an answer in free text."""
    if is_dataclass(value):
        out = {}
        for name, default in _defaults(type(value)):
            v = _plain(getattr(value, name))
            if v is not None and v != "" and v != default:
                out[name] = v
        return out
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@functools.cache
def _defaults(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, default as `_plain` writes it; None where it has none) of each field the key reads."""
    out = []
    for f in fields(cls):
        if f.name in _TRANSPORT or f.name in _IDS:
            continue
        default = f.default if f.default is not MISSING else \
            f.default_factory() if f.default_factory is not MISSING else None
        out.append((f.name, _plain(default)))
    return tuple(out)


def _options(opts: SamplingOptions) -> dict[str, Any]:
    out = _plain(opts)
    for name in _FLOAT_OPTIONS & out.keys():
        out[name] = float(out[name])  # `0` from one dialect and `0.0` from another are the same temperature
    extra = {k: v for k, v in sorted(out.pop("extra", {}).items()) if k not in _PERFORMANCE_KNOBS}
    if extra:
        out["extra"] = extra
    if "logit_bias" in out:
        out["logit_bias"] = dict(sorted(out["logit_bias"].items()))
    return out


def canonical(req: Request) -> dict[str, Any]:
    """Everything that changes the answer, in a stable shape."""
    out = _plain(req)
    out["kind"] = "chat" if isinstance(req, ChatRequest) else "completion"
    out["options"] = _options(req.options)
    if isinstance(req, ChatRequest):
        _link_results(req.messages, out["messages"])
        if "template_kwargs" in out:
            out["template_kwargs"] = dict(sorted(out["template_kwargs"].items()))
    return out


def _link_results(messages: list[Message], plain: list[dict[str, Any]]) -> None:
    """Which call each tool result answers, written as the call's place in the conversation: ids are made up per
    client and left out, but which result goes with which call changes the answer (parallel calls' results come
    back in the order they finished)."""
    place: dict[str, int] = {}
    for msg, out in zip(messages, plain):
        for call, out_call in zip(msg.tool_calls, out.get("tool_calls", ())):
            if call.id:
                out_call["call"] = place.setdefault(call.id, len(place))
        if msg.tool_call_id:
            out["answers"] = place.get(msg.tool_call_id, msg.tool_call_id)


def digest(value: Any) -> str:
    """XXH3-128 of the orjson encoding, as hex. Keys stay in the order given: a backend writes an object's keys in
    its schema's order and a template renders a tool's parameters as listed, so sorted, a format asking for "answer"
    then "reasoning" was served the answer written in the other order. Maps whose order means nothing (Ollama's
    options, logit_bias, template variables) are sorted by `canonical`; a dataclass's fields come in their order."""
    return xxhash.xxh3_128_hexdigest(dumps(value))


def exact_key(req: Request, scope: str) -> str:
    return digest([scope, canonical(req)])


def backend_only(req: Request) -> list[Any]:
    """What reaches the backend with a request but does not change its answer, which the key leaves out:
    `keep_alive` and Ollama's performance options. Requests sharing one backend call (coalescing) must agree on
    it: only the leader's goes."""
    return [req.keep_alive, {k: v for k, v in sorted(req.options.extra.items()) if k in _PERFORMANCE_KNOBS}]


def semantic_query(req: Request) -> tuple[str, list[Any]] | None:
    """Split a request into (text to embed, exact context) or None when semantic matching would be unsafe.

    The text is the last user turn. Everything else that shapes the answer - model, system prompt, tools,
    format, sampling options and the earlier turns of the conversation - goes into the exact context, so two
    conversations that differ before their last turn never share a semantic entry. Images, tool results as the
    last turn, raw prompts and fill-in-the-middle are exact-only: an embedding of the text cannot see them.
    """
    canon = canonical(req)
    if isinstance(req, CompletionRequest):
        if req.raw or req.suffix or req.images or req.context or not req.prompt.strip():
            return None
        canon.pop("prompt")
        return req.prompt, [canon]
    last: Message | None = req.messages[-1] if req.messages else None
    if last is None or last.role != "user" or last.images or not last.content.strip():
        return None
    canon["messages"] = canon["messages"][:-1]
    return last.content, [canon]
