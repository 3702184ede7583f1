"""Tiny random Llama / Qwen2 / Qwen3 checkpoints written as Hugging Face folders, for tests that must run in
seconds on CPU. The tokenizer is byte-level BPE without merges (one token per byte), so any non-ASCII
character spans several tokens: exactly what UTF-8-safe streaming has to handle."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def engine_options(model: str, **over: Any) -> dict[str, Any]:
    """The engine backend's options over a tiny model at `model`, as the adapter and proxy tests run it: named
    "tiny", no progress bar, 4-token KV blocks in 8 MiB (a few short prompts fill them); `over` changes any."""
    return {"model": model, "name": "tiny", "progress": False, "block_size": 4, "kv_memory": 8 * 2**20, **over}


def byte_tokenizer(added: tuple[str, ...] = ()) -> Tokenizer:
    """`added`: more special tokens after SPECIALS (FIM markers, say)."""
    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tk = Tokenizer(models.BPE(vocab, [], ignore_merges=False))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in [*SPECIALS, *added]])
    return tk


def write_tiny_model(path: str, arch: str = "llama", seed: int = 0, added: tuple[str, ...] = (), **overrides) -> str:
    """Save a random `arch` ("llama", "qwen2", "qwen3") model with its tokenizer (byte_tokenizer(added)) to path;
    returns path."""
    import transformers
    tk = byte_tokenizer(added)
    common = dict(vocab_size=tk.get_vocab_size() + 5, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=None, eos_token_id=tk.token_to_id("<|im_end|>"), tie_word_embeddings=False)
    common |= overrides
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[arch]
    torch.manual_seed(seed)
    model = cls[1](cls[0](**common)).eval()
    with torch.no_grad():  # random init is too smooth for greedy ties to be rare; widen the logits
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.save_pretrained(path, safe_serialization=True)
    tk.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}, f)
    return path


def _llama_cpp_permute(w, heads: int):
    """llama.cpp's converter interleaves q/k rows for its rotary layout; the loader must undo it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_spm_gguf(path: str, corpus: str, seed: int = 0, quant: dict[str, str] | None = None) -> str:
    """A tiny random Llama as a float32 GGUF with a SentencePiece vocabulary (`tokenizer.ggml.model = llama`,
    as Llama 2 and Mistral files have): byte-fallback tokens, the corpus' characters and some scored merges.
    `quant`: GGUF quantization type by tensor kind (`attn_v`, `ffn_down`, `output`, ...), float32 otherwise."""
    import gguf
    import numpy as np
    chars = sorted(set(corpus.replace(" ", "\u2581")) | {"\u2581"})
    words = sorted({"\u2581" + w for w in corpus.split()} | {"he", "in", "er", "th", "\u2581t", "\u2581a"})
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars + words
    types = [2, 3, 3] + [6] * 256 + [1] * (len(chars) + len(words))
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(chars) + len(words))]
    hidden, inter, layers, heads, kv_heads = 64, 128, 2, 4, 2
    w = gguf.GGUFWriter(path, "llama")
    for add, value in ((w.add_block_count, layers), (w.add_context_length, 256), (w.add_embedding_length, hidden),
                       (w.add_feed_forward_length, inter), (w.add_head_count, heads), (w.add_head_count_kv, kv_heads),
                       (w.add_layer_norm_rms_eps, 1e-5), (w.add_rope_freq_base, 10000.0),
                       (w.add_rope_dimension_count, hidden // heads), (w.add_tokenizer_model, "llama"),
                       (w.add_token_list, tokens), (w.add_token_scores, scores), (w.add_token_types, types),
                       (w.add_bos_token_id, 1), (w.add_eos_token_id, 2), (w.add_unk_token_id, 0),
                       (w.add_add_bos_token, True)):
        add(value)
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return rng.normal(0, 0.2, shape).astype(np.float32)

    def add(name: str, data) -> None:
        kind = (quant or {}).get(name.split(".")[-2])
        if kind is None:
            w.add_tensor(name, data)
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    add("token_embd.weight", rand(len(tokens), hidden))
    add("output.weight", rand(len(tokens), hidden))
    w.add_tensor("output_norm.weight", 1 + rand(hidden) / 4)
    head_dim = hidden // heads
    for i in range(layers):
        p = f"blk.{i}."
        add(p + "attn_q.weight", _llama_cpp_permute(rand(heads * head_dim, hidden), heads))
        add(p + "attn_k.weight", _llama_cpp_permute(rand(kv_heads * head_dim, hidden), kv_heads))
        add(p + "attn_v.weight", rand(kv_heads * head_dim, hidden))
        add(p + "attn_output.weight", rand(hidden, heads * head_dim))
        for name, shape in (("ffn_gate", (inter, hidden)), ("ffn_up", (inter, hidden)), ("ffn_down", (hidden, inter))):
            add(p + name + ".weight", rand(*shape))
        w.add_tensor(p + "attn_norm.weight", 1 + rand(hidden) / 4)
        w.add_tensor(p + "ffn_norm.weight", 1 + rand(hidden) / 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
