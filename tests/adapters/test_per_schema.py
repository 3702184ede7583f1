"""What is made from a schema is kept per schema, under a digest, and only for schemas of a size tools have."""
from __future__ import annotations

import pytest

from adapters.per_schema import MAX_KEPT_BYTES, PerSchema


def test_a_schema_is_made_once_and_a_large_one_is_never_kept():
    made: list[dict] = []
    per_schema = PerSchema(lambda schema: made.append(schema) or len(made), entries=2)
    small = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert per_schema(small) == per_schema({"properties": {"a": {"type": "string"}}, "type": "object"})
    assert len(made) == 1  # the same schema, its keys in another order
    large = {"type": "object", "description": "x" * MAX_KEPT_BYTES}
    per_schema(large)
    per_schema(large)
    assert len(made) == 3 and all(len(key) == 16 for key in per_schema.kept)  # a digest, never the bytes
    for n in range(3):
        per_schema({"type": "string", "maxLength": n})
    assert len(per_schema.kept) == 2


def test_a_failure_keeps_nothing():
    def refuse(schema: dict) -> int:
        raise ValueError("no")
    per_schema = PerSchema(refuse)
    with pytest.raises(ValueError):
        per_schema({"type": "object"})
    assert not per_schema.kept


async def test_a_large_schema_is_made_off_the_event_loop_and_what_is_kept_stays_on_it():
    """llguidance took 92 ms over a 268 KB schema, with the event loop held; a schema of a tool's size is made on
    the loop (a hop to a thread costs more) and kept."""
    import threading

    from adapters.per_schema import INLINE_BYTES, MAX_KEPT_BYTES

    made_on: list[str] = []

    def make(schema: dict) -> int:
        made_on.append(threading.current_thread().name)
        return len(schema["properties"])
    kept = PerSchema(make)
    small = {"type": "object", "properties": {"a": {"type": "string"}}}
    large = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(INLINE_BYTES // 10)}}
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(MAX_KEPT_BYTES // 10)}}
    assert [await kept.off_loop(s) for s in (small, small, large, large, huge, huge)] == [
        1, 1, INLINE_BYTES // 10, INLINE_BYTES // 10, MAX_KEPT_BYTES // 10, MAX_KEPT_BYTES // 10]
    main = threading.current_thread().name
    assert made_on[0] == main and all(name != main for name in made_on[1:])  # small once; large once; huge twice
    assert len(made_on) == 4 and len(kept.kept) == 2
