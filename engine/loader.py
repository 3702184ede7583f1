"""Load a model and its tokenizer from a GGUF file or a Hugging Face safetensors folder.

GGUF tensors are dequantized to float through `gguf.quants.dequantize` (numpy); on CPU, 4-bit layer matrices
stay 4-bit (engine/int4.py) and 5- to 8-bit ones become int8 (engine/int8.py) for decode steps, the LM head
too. All are renamed to Hugging Face names, and for the llama architecture the q/k rows are un-permuted:
llama.cpp's converter interleaves them for its rotary layout, while our model uses Hugging Face's rotate-half
layout.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from engine.int4 import int4_from_gguf, int8_planes_from_gguf
from engine.int8 import INT8_TYPES, Int8Source
from engine.models.llama import LlamaModel, ModelConfig, rope_inv_freq
from engine.tokenizer import Tokenizer

ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                 "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama",
                 "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}

GGUF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
              "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
              "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
              "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj"}


@dataclass
class LoadedModel:
    model: LlamaModel
    tokenizer: Tokenizer
    info: dict  # architecture, name, context_length, parameters, quantization, chat_template, general (GGUF), ...


def load(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu", progress: bool = True,
         int4: bool = True) -> LoadedModel:
    """Load a `.gguf` file or a folder with config.json, *.safetensors and tokenizer.json. Before an engine
    serves it, load on a passing thread (LLMEngine.from_pretrained does): engine/threads.py. `int4`: on CPU,
    4-bit GGUF matrices stay 4-bit for decode steps (engine/int4.py)."""
    if os.path.isdir(path):
        cfg, weights, tokenizer, info = _read_hf_folder(path, progress)
    elif path.endswith(".gguf"):
        cfg, weights, tokenizer, info = _read_gguf(path, progress, int4 and torch.device(device).type == "cpu")
    else:
        raise ValueError(f"{path}: expected a .gguf file or a Hugging Face model folder")
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model.load_hf_weights({k: v.to(device=device, dtype=dtype) if isinstance(v, torch.Tensor) else v
                           for k, v in weights.items()}, dtype)
    model.rotary.inv_freq = rope_inv_freq(cfg).to(device)  # non-persistent, so still on "meta"
    model.eval().requires_grad_(False)
    info |= {"architecture": cfg.architecture, "context_length": cfg.max_position,
             "parameters": model.num_parameters, "chat_template": tokenizer.chat_template,
             "dtype": str(dtype).removeprefix("torch."), "path": path}
    return LoadedModel(model, tokenizer, info)


# -- Hugging Face folders ----------------------------------------------------------------------

def _read_hf_folder(path: str, progress: bool):
    from safetensors.torch import load_file
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    arch = ARCHITECTURES.get((hf.get("architectures") or [hf.get("model_type")])[0]) \
        or ARCHITECTURES.get(hf.get("model_type", ""))
    if arch is None:
        raise ValueError(f"{path}: unsupported architecture {hf.get('architectures')}")
    heads = hf["num_attention_heads"]
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}  # transformers 5 writes rope_parameters
    cfg = ModelConfig(
        architecture=arch, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=hf.get("rope_theta") or rope.get("rope_theta", 10000.0), rope_scaling=rope or None,
        max_position=hf.get("max_position_embeddings", 4096),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        attention_bias=arch == "qwen2" or hf.get("attention_bias", False), qk_norm=arch == "qwen3")
    weights = {}
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    for file in tqdm(files, desc="loading weights", disable=not progress):
        weights |= load_file(file)
    info = {"name": os.path.basename(os.path.normpath(path)), "quantization": hf.get("torch_dtype", "unknown")}
    return cfg, weights, Tokenizer.from_hf_folder(path), info


# -- GGUF --------------------------------------------------------------------------------------

def _read_gguf(path: str, progress: bool, int4: bool):
    reader, meta = _gguf_meta(path)
    gguf_arch = meta["general.architecture"]
    arch = ARCHITECTURES.get(gguf_arch)
    if arch is None:
        raise ValueError(f"{path}: unsupported GGUF architecture {gguf_arch!r}")
    cfg = _gguf_config(meta, arch, {t.name for t in reader.tensors},
                       len(reader.fields["tokenizer.ggml.tokens"].data))
    weights = {}
    head = "token_embd.weight" if cfg.tie_word_embeddings else "output.weight"
    for t in tqdm(reader.tensors, desc="reading weights", disable=not progress):
        packed = None
        if int4 and t.name.startswith("blk."):
            packed = int4_from_gguf(t)
        elif int4 and t.name == head:
            packed = int4_from_gguf(t) or int8_planes_from_gguf(t)
        order = _qk_row_order(t.name, cfg, gguf_arch)
        if packed is not None:
            weights[_gguf_name(t.name)] = packed if order is None else packed.rows(order)  # (heads are not q/k)
        elif int4 and (t.name.startswith("blk.") or t.name == head) and t.tensor_type.name in INT8_TYPES \
                and len(t.shape) == 2:
            weights[_gguf_name(t.name)] = Int8Source(_dequantize(t, order))
        else:
            weights[_gguf_name(t.name)] = _dequantize(t, order)
    tokenizer = Tokenizer.from_gguf(reader, meta)
    types = sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type.name not in ("F32", "F16")})
    # the file's own description (basename, organization, license, size label), which Ollama's show lists and
    # Copilot names the model by
    general = {k: v for k, v in meta.items() if k.startswith("general.") and isinstance(v, (str, int, float))}
    info = {"name": meta.get("general.name") or os.path.basename(path), "quantization": "+".join(types) or "F32",
            "general": general}
    return cfg, weights, tokenizer, info


def gguf_tokenizer(path: str) -> Tokenizer:
    """A GGUF file's tokenizer alone, without its weights (a client that sends token ids needs them)."""
    return Tokenizer.from_gguf(*_gguf_meta(path))


def _gguf_meta(path: str) -> tuple[Any, dict]:
    """The file's reader and its metadata, less the vocabulary's arrays (Tokenizer.from_gguf reads those)."""
    import gguf
    reader = gguf.GGUFReader(path)
    vocab_arrays = {f"tokenizer.ggml.{k}" for k in ("tokens", "merges", "token_type", "scores")}
    return reader, {k: f.contents() for k, f in reader.fields.items() if k not in vocab_arrays}


def _gguf_config(meta: dict, arch: str, tensor_names: set[str], vocab_size: int) -> ModelConfig:
    a = meta["general.architecture"]
    heads = meta[f"{a}.attention.head_count"]
    hidden = meta[f"{a}.embedding_length"]
    head_dim = meta.get(f"{a}.attention.key_length") or meta.get(f"{a}.rope.dimension_count") or hidden // heads
    scaling = None
    if meta.get(f"{a}.rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": meta[f"{a}.rope.scaling.factor"]}
    return ModelConfig(
        architecture=arch, vocab_size=vocab_size, hidden_size=hidden,
        intermediate_size=meta[f"{a}.feed_forward_length"], num_layers=meta[f"{a}.block_count"],
        num_heads=heads, num_kv_heads=meta.get(f"{a}.attention.head_count_kv", heads), head_dim=head_dim,
        rms_norm_eps=meta[f"{a}.attention.layer_norm_rms_epsilon"],
        rope_theta=meta.get(f"{a}.rope.freq_base", 10000.0), rope_scaling=scaling,
        max_position=meta.get(f"{a}.context_length", 4096),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names, qk_norm="blk.0.attn_q_norm.weight" in tensor_names)


def _gguf_name(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{GGUF_NAMES[parts[2]]}.{parts[3]}"
    return f"{GGUF_NAMES[parts[0]]}.{parts[1]}"


def _qk_row_order(name: str, cfg: ModelConfig, gguf_arch: str) -> np.ndarray | None:
    """For llama's q/k matrices (and their biases), the rows in rotate-half order: `new = old[order]`."""
    if gguf_arch not in ("llama", "mistral") or not name.endswith(("attn_q.weight", "attn_k.weight")):
        return None
    heads = cfg.num_heads if "attn_q" in name else cfg.num_kv_heads
    return np.arange(heads * cfg.head_dim).reshape(heads, -1, 2).swapaxes(1, 2).reshape(-1)


def _dequantize(t, order: np.ndarray | None) -> torch.Tensor:
    import gguf
    data = gguf.quants.dequantize(t.data, t.tensor_type)
    data = np.ascontiguousarray(data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
    if order is not None:
        data = data[order]
    return torch.from_numpy(np.array(data, copy=True))
