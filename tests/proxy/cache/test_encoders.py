"""The ONNX sentence encoder against sentence-transformers on the same model, its export cache, and the fallback."""
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
def onnx_encoder(cache_home) -> OnnxEncoder:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", cache_home)
        encoder = load_encoder(default_model_path())
    assert isinstance(encoder, OnnxEncoder)
    return encoder


def test_onnx_vectors_match_sentence_transformers(onnx_encoder):
    from sentence_transformers import SentenceTransformer
    reference = TorchEncoder(SentenceTransformer(default_model_path(), device="cpu"), onnx_encoder.dim)
    ours, theirs = onnx_encoder.encode(TEXTS), reference.encode(TEXTS)  # one padded batch of unequal lengths
    assert ours.shape == theirs.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    assert (ours * theirs).sum(axis=1).min() > 0.9999
    alone = np.concatenate([onnx_encoder.encode([t]) for t in TEXTS])  # padding changes nothing
    assert np.allclose(alone, ours, atol=1e-5)
    assert onnx_encoder.encode([]).shape == (0, 384)


def test_the_export_is_reused(onnx_encoder, cache_home, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", cache_home)
    exported = list((Path(cache_home) / "velo" / "onnx").glob("*.onnx"))
    assert len(exported) == 1
    before = exported[0].stat().st_mtime_ns
    assert isinstance(load_encoder(default_model_path()), OnnxEncoder)
    assert exported[0].stat().st_mtime_ns == before


def test_a_failed_export_falls_back_to_sentence_transformers(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def broken(*_):
        raise RuntimeError("exporter cannot trace this")
    monkeypatch.setattr(encoders, "_exported", broken)
    encoder = load_encoder(default_model_path())
    assert isinstance(encoder, TorchEncoder)
    assert encoder.encode(["hello"]).shape == (1, 384)
