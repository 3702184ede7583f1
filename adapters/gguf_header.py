"""A GGUF file's key-value metadata, read from its header alone.

`gguf.GGUFReader` maps every tensor and every array item into numpy objects first: 3.3 s for SmolLM2's header and
13.2 s for Qwen2.5-Coder's (151k-token vocabulary) on this 2-core machine, longer than the 3 s a model listing may
take. This reads the key-value section only, straight from the file (GGUF v2/v3, little-endian), with arrays of
strings kept whole only for the keys asked for.
"""
from __future__ import annotations

import struct
from typing import Any, BinaryIO

from gguf import GGMLQuantizationType

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


def _tensor(f: BinaryIO) -> dict[str, Any]:
    """A tensor's info as Ollama's /api/show lists it (api.Tensor: name, type, shape as the file orders it)."""
    name = _string(f)
    shape = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
    kind = _read(f, "<I")
    _read(f, "<Q")  # where its data starts
    try:
        type_name = GGMLQuantizationType(kind).name
    except ValueError:
        type_name = "unknown"  # Ollama's TensorType.String() for a type it does not know
    return {"name": name, "type": type_name, "shape": shape}


def read_header(path: str, arrays: frozenset[str] = frozenset(),
                whole: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every key with its value, an array of more than SHORT items as [] (as Ollama's /api/show has it without
    `verbose`) unless `whole` or its key is in `arrays`; and every tensor's name, type and shape, which follow the
    keys in the file (no tensor data is read)."""
    out: dict[str, Any] = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = _read(f, "<I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        tensors = _read(f, "<Q")
        for _ in range(_read(f, "<Q")):
            key = _string(f)
            out[key] = _value(f, _read(f, "<I"), whole or key in arrays)
        return out, [_tensor(f) for _ in range(tensors)]


def read_metadata(path: str, arrays: frozenset[str] = frozenset(), whole: bool = False) -> dict[str, Any]:
    """read_header's keys alone."""
    return read_header(path, arrays, whole)[0]
