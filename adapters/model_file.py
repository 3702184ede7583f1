"""What Ollama's /api/tags says about a model's file (size, `modified_at`, `digest`), for backends whose model
file is on this machine. Open WebUI and `ollama list` show the date and a short digest; a listing that says
1970 and an empty digest looks broken."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .protocol import rfc3339


@dataclass(frozen=True)
class ModelFile:
    size: int         # bytes, all files of a folder together
    modified_at: str  # RFC 3339 in UTC, of the newest file
    digest: str       # sha256 hex of each file's name, size and modification time


def model_file(path: str) -> ModelFile | None:
    """A .gguf file or a model folder; None when path is not on this machine. The digest hashes what `stat`
    says, not the bytes: like Ollama's (a hash of the manifest), it changes when the model does, and reading a
    multi-gigabyte file on every listing would not be worth it."""
    root = Path(path)
    if not path or not root.exists():
        return None
    folder = root.is_dir()
    files = sorted(f for f in root.rglob("*") if f.is_file()) if folder else [root]
    stats = [f.stat() for f in files]
    h = hashlib.sha256()
    for f, st in zip(files, stats):
        h.update(f"{f.relative_to(root) if folder else f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    newest = max((st.st_mtime for st in stats), default=root.stat().st_mtime)
    return ModelFile(sum(st.st_size for st in stats), rfc3339(newest), h.hexdigest())
