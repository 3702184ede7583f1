"""Tiny random Llama / Qwen2 / Qwen3 checkpoints written as Hugging Face folders, for tests that must run in
seconds on CPU. The tokenizer is byte-level BPE without merges (one token per byte), so any non-ASCII
character spans several tokens: exactly what UTF-8-safe streaming has to handle."""

from __future__ import annotations

import json
import os

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokenizer() -> Tokenizer:
    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tk = Tokenizer(models.BPE(vocab, [], ignore_merges=False))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tk


def write_tiny_model(path: str, arch: str = "llama", seed: int = 0, **overrides) -> str:
    """Save a random `arch` ("llama", "qwen2", "qwen3") model with its tokenizer to path; returns path."""
    import transformers
    tk = byte_tokenizer()
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
