"""The ONNX sentence encoders (float32 and int8) against sentence-transformers on the same model, their export
cache, and the fallback."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from proxy.cache import encoders
from proxy.cache.encoders import OnnxEncoder, TorchEncoder, default_model_path, load_encoder

TEXTS = ["How do I learn Python quickly?", "What is the capital of France?", "hi",
         "Explain the difference between a process and a thread in an operating system, with an example " * 4,
         "Wie spät ist es?", "def add(a, b): return a + b", ""]


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(scope="module")
def onnx_encoders(cache_home) -> dict[str, OnnxEncoder]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", cache_home)
        encoders_ = {p: load_encoder(default_model_path(), p) for p in ("int8", "float32")}
    assert all(isinstance(e, OnnxEncoder) for e in encoders_.values())
    return encoders_


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer
    return TorchEncoder(SentenceTransformer(default_model_path(), device="cpu"), 384, "torch").encode(TEXTS)


def test_float32_vectors_match_sentence_transformers(onnx_encoders, reference):
    ours = onnx_encoders["float32"].encode(TEXTS)
    assert ours.shape == reference.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    assert (ours * reference).sum(axis=1).min() > 0.9999
    assert onnx_encoders["float32"].encode([]).shape == (0, 384)


def test_int8_vectors_stay_close_to_sentence_transformers(onnx_encoders, reference):
    ours = onnx_encoders["int8"].encode(TEXTS)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    cosines = (ours * reference).sum(axis=1)
    assert cosines.min() > 0.97 and cosines.mean() > 0.99
    assert not np.allclose(ours, reference, atol=1e-4)  # really the quantized model


@pytest.mark.parametrize("precision", ["int8", "float32"])
def test_a_vector_does_not_depend_on_its_batch(onnx_encoders, precision):
    encoder = onnx_encoders[precision]
    alone = np.concatenate([encoder.encode([t]) for t in TEXTS])
    assert np.array_equal(alone, encoder.encode(TEXTS))
    assert np.array_equal(alone[:2], encoder.encode(TEXTS[:2] + ["a long neighbour " * 60])[:2])


def test_each_precision_has_its_own_name(onnx_encoders):
    names = {p: e.name for p, e in onnx_encoders.items()}
    assert names["int8"] != names["float32"] and all(p in names[p] for p in names)


def test_the_exports_are_reused(onnx_encoders, cache_home, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", cache_home)
    exported = sorted((Path(cache_home) / "velo" / "onnx").glob("*"))
    assert [f.name.split(".", 1)[1] for f in exported] == ["float32.onnx", "int8.onnx"]  # no partial files left
    before = [f.stat().st_mtime_ns for f in exported]
    assert isinstance(load_encoder(default_model_path(), "int8"), OnnxEncoder)
    assert [f.stat().st_mtime_ns for f in exported] == before


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision"):
        load_encoder(default_model_path(), "int4")


def test_a_failed_export_falls_back_to_sentence_transformers(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def broken(*_):
        raise RuntimeError("exporter cannot trace this")
    monkeypatch.setattr(encoders, "_exported", broken)
    encoder = load_encoder(default_model_path())
    assert isinstance(encoder, TorchEncoder)
    assert encoder.encode(["hello"]).shape == (1, 384)
