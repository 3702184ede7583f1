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
