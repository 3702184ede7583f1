"""The roofline's parts: copy bandwidth, and the bytes of weights a decode step reads."""

from __future__ import annotations

import os

import torch

from engine import default_model_path
from engine.loader import load
from engine.roofline import decode_bytes, gguf_decode_bytes, memory_bandwidth


def test_copy_bandwidth_is_a_plausible_rate():
    assert 0.5 < memory_bandwidth(size_bytes=64 * 2**20, reps=2, threads=1) < 10_000


def test_decode_bytes_count_the_head_but_not_an_untied_embedding(tiny_llama):
    model = load(tiny_llama, progress=False).model
    everything = sum(p.numel() * p.element_size() for p in model.parameters())
    assert model.lm_head is not None
    assert decode_bytes(model) == everything - model.embed_tokens.weight.numel() * 4


def test_shipped_model_bytes_four_bit_layers_as_packed():
    path = default_model_path()
    packed = load(path, torch.bfloat16, progress=False, int4=True).model
    dense = load(path, torch.bfloat16, progress=False, int4=False).model
    assert decode_bytes(packed) < 0.6 * decode_bytes(dense)
    assert 0.9 * os.path.getsize(path) < gguf_decode_bytes(path) < os.path.getsize(path)  # tied: all of it
