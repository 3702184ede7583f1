"""The date, size and digest that /api/tags shows for a model file on this machine."""
import os

from adapters.model_file import model_file
from adapters.protocol import epoch, rfc3339


def test_file_date_size_and_a_digest_that_follows_the_file(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"x" * 10)
    os.utime(path, (1714557600, 1714557600))
    first = model_file(str(path))
    assert (first.size, first.modified_at) == (10, "2024-05-01T10:00:00Z")
    assert len(first.digest) == 64 and model_file(str(path)) == first  # stable while the file is unchanged
    os.utime(path, (1714557601, 1714557601))
    assert model_file(str(path)).digest != first.digest


def test_folder_sums_its_files_and_takes_the_newest_date(tmp_path):
    for name, size, mtime in [("config.json", 3, 1000), ("model.safetensors", 7, 2000)]:
        (tmp_path / name).write_bytes(b"x" * size)
        os.utime(tmp_path / name, (mtime, mtime))
    folder = model_file(str(tmp_path))
    assert (folder.size, folder.modified_at) == (10, rfc3339(2000))
    (tmp_path / "extra.bin").write_bytes(b"")
    os.utime(tmp_path / "extra.bin", (1500, 1500))
    assert model_file(str(tmp_path)).digest != folder.digest


def test_missing_paths_and_time_parsing(tmp_path):
    assert model_file(str(tmp_path / "gone.gguf")) is None and model_file("") is None
    assert epoch("2024-05-01T10:00:00.123456789-07:00") == 1714582800  # Ollama's own format
    assert epoch(rfc3339(1700000000)) == 1700000000
    assert epoch("yesterday") == 0
