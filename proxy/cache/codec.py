"""Chunk lists <-> bytes (orjson). Chunk boundaries are kept so a cached answer replays as a stream."""
from __future__ import annotations

from typing import Any

from adapters.exact_json import dumps, loads
from adapters.protocol import Chunk, TokenLogprob, ToolCall, Usage


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
        tool_calls=[ToolCall(**t) for t in raw["tool_calls"]],
        logprobs=[_logprob(lp) for lp in raw["logprobs"]],
        finish_reason=raw["finish_reason"],
        usage=Usage(**raw["usage"]) if raw["usage"] is not None else None,
        context=raw["context"],
        stop_sequence=raw.get("stop_sequence"),  # absent from entries written before it was kept
    )


def decode_chunks(data: bytes) -> list[Chunk]:
    return [_chunk(raw) for raw in loads(data)]
