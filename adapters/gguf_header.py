"""A GGUF file's key-value metadata, read from its header alone.

`gguf.GGUFReader` maps every tensor and every array item into numpy objects first: 3.3 s for SmolLM2's header and
13.2 s for Qwen2.5-Coder's (151k-token vocabulary) on this 2-core machine, longer than the 3 s a model listing may
take. This reads the key-value section only, straight from the file (GGUF v2/v3, little-endian), with arrays of
strings kept whole only for the keys asked for.
"""
from __future__ import annotations

import struct
from typing import Any, BinaryIO

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
SHORT = 5  # Ollama's getModelData (server/routes.go): an array of more items is shown as [] unless verbose


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    return struct.unpack(fmt, f.read(size))[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "<Q")).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, keep: bool) -> Any:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, count = _read(f, "<I"), _read(f, "<Q")
        whole = keep or count <= SHORT
        if item in _SCALARS and not whole:
            f.seek(count * struct.calcsize(_SCALARS[item]), 1)
            return []
        items = [_value(f, item, keep) for _ in range(count)]
        return items if whole else []
    return _read(f, _SCALARS[kind])


def read_metadata(path: str, arrays: frozenset[str] = frozenset(), whole: bool = False) -> dict[str, Any]:
    """Every key with its value; an array of more than SHORT items is [] (as Ollama's /api/show has it without
    `verbose`) unless `whole` or its key is in `arrays`."""
    out: dict[str, Any] = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = _read(f, "<I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        _read(f, "<Q")  # tensor count
        for _ in range(_read(f, "<Q")):
            key = _string(f)
            out[key] = _value(f, _read(f, "<I"), whole or key in arrays)
    return out
