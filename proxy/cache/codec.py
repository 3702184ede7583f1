"""Chunk lists <-> bytes (orjson). Chunk boundaries are kept so a cached answer replays as a stream."""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from adapters.exact_json import dumps, loads
from adapters.protocol import Chunk, TokenLogprob, ToolCall, Usage

T = TypeVar("T")
_FIELDS: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in dataclasses.fields(cls))
                                        for cls in (ToolCall, Usage)}


class UnreadableEntry(ValueError):
    """A tier's bytes that are no answer this Velo can read: damaged, or written by another version of it to a tier
    they share (Redis, PostgreSQL, a SQLite file)."""


def encode_chunks(chunks: list[Chunk]) -> bytes:
    return dumps(chunks, default=_bytes)


def _bytes(value: Any) -> list[int]:
    """A token's raw bytes (TokenLogprob.raw), which JSON has no type for."""
    if isinstance(value, bytes):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _logprob(raw: Any) -> TokenLogprob:
    if isinstance(raw, list):  # an alternative as [token, logprob], as entries were written before `raw` was kept
        return TokenLogprob(*raw)
    return TokenLogprob(raw["token"], raw["logprob"], [_logprob(t) for t in raw["top"]],
                        None if raw.get("raw") is None else bytes(raw["raw"]))


def _chunk(raw: dict[str, Any]) -> Chunk:
    return Chunk(
        text=raw["text"],
        thinking=raw["thinking"],
        tool_calls=[_known(ToolCall, t) for t in raw["tool_calls"]],
        logprobs=[_logprob(lp) for lp in raw["logprobs"]],
        finish_reason=raw["finish_reason"],
        usage=_known(Usage, raw["usage"]) if raw["usage"] is not None else None,
        context=raw["context"],
        stop_sequence=raw.get("stop_sequence"),  # absent from entries written before it was kept
    )


def _known(cls: type[T], raw: dict[str, Any]) -> T:
    """`cls` from the fields it has: a newer Velo's entry adds some (ToolCall.text did), which the constructor
    refused."""
    return cls(**{name: raw[name] for name in _FIELDS[cls] if name in raw})


def decode_chunks(data: bytes) -> list[Chunk]:
    try:
        return [_chunk(raw) for raw in loads(data)]
    except (KeyError, TypeError, ValueError) as e:  # orjson's JSONDecodeError is a ValueError
        raise UnreadableEntry(f"{type(e).__name__}: {e}") from e
