"""Integers past 64 bits, which orjson reads as a float (or refuses past a double's range) and cannot write, are read
and written whole; everything else reads and writes as orjson does."""
from __future__ import annotations

import json
from dataclasses import dataclass

import orjson
import pytest

from adapters.exact_json import dumps, loads

BIG = 12345678901234567890123


@pytest.mark.parametrize("text", [
    '{"id": 12345678901234567890123}', b"[-9223372036854775809, 1.5, 2e19, 18446744073709551616]",
    "[" + "9" * 400 + "]", '{"a": "12345678901234567890123", "b": 1844674407370955161}'])
def test_integers_orjson_cannot_hold_are_read_and_written_whole(text: str | bytes) -> None:
    value = loads(text)
    assert value == json.loads(text)
    assert dumps(value) == json.dumps(value, separators=(",", ":")).encode()


@pytest.mark.parametrize("text", ["[NaN, 12345678901234567890123]", "[1e400, 12345678901234567890123]",
                                  '{"a": 12345678901234567890123,}', "[" + "9" * 5000 + "]", "[1e400]"])
def test_what_orjson_refuses_stays_refused(text: str) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        loads(text)


@dataclass
class Call:
    name: str
    arguments: dict


def test_a_dataclass_holding_one_is_written_as_orjson_writes_it() -> None:
    written = dumps([Call("f", {"id": BIG, "raw": b"x"})], default=list)
    assert written == b'[{"name":"f","arguments":{"id":%d,"raw":[120]}}]' % BIG
    assert dumps({"b": BIG, "a": 1}, option=orjson.OPT_SORT_KEYS) == b'{"a":1,"b":%d}' % BIG
    with pytest.raises(TypeError):
        dumps({"a": object()})
