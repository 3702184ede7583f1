"""5- to 8-bit GGUF matrices as per-row int8 for decode steps, read from a tiny GGUF written in the test."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.int4 import Int4Linear
from engine.int8 import Int8Linear, Int8Weight
from engine.loader import load
from tests.engine.tiny import write_tiny_spm_gguf

TYPES = {"attn_q": "Q4_0", "attn_k": "Q4_0", "attn_v": "Q8_0", "ffn_gate": "Q4_0", "ffn_up": "Q4_0",
         "ffn_down": "Q5_0", "output": "Q5_0"}


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory) -> str:
    return write_tiny_spm_gguf(str(tmp_path_factory.mktemp("q") / "tiny-q.gguf"), "the cat sat on the mat", quant=TYPES)


def test_int8_rows_round_trip_within_half_a_step():
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-2, 1, 48)[:, None]
    q = Int8Weight.of(w)
    assert q.q.dtype == torch.int8 and q.scale.shape == (48,)
    assert ((q.dequantize() - w).abs() <= q.scale[:, None] / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_five_to_eight_bit_matrices_load_as_int8_and_four_bit_ones_as_int4(quantized_gguf, dtype):
    model = load(quantized_gguf, dtype, progress=False).model
    layer = model.layers[0]
    assert isinstance(layer.self_attn.qkv, Int8Linear)  # Q4_0 q and k beside a Q8_0 v: int8 together
    assert isinstance(layer.mlp.gate_up, Int4Linear) and isinstance(layer.mlp.down_proj, Int8Linear)
    assert isinstance(model.packed_head, Int8Linear)
    assert not isinstance(layer.self_attn.o_proj, (Int4Linear, Int8Linear))
    reader = gguf.GGUFReader(quantized_gguf)
    down = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    expected = torch.from_numpy(np.array(gguf.quants.dequantize(down.data, down.tensor_type)))
    assert torch.equal(layer.mlp.down_proj.dense, expected.to(dtype))  # prompts: the file's own weights
    x = torch.randn(3, model.cfg.intermediate_size, generator=torch.Generator().manual_seed(1)).to(dtype)
    dense = layer.mlp.down_proj(x, quantized=False).float()
    error = (layer.mlp.down_proj(x, quantized=True).float() - dense).abs().max() / dense.abs().max()
    assert 0 < error < 2e-2
    hidden = torch.randn(2, model.cfg.hidden_size, generator=torch.Generator().manual_seed(2)).to(dtype)
    logits = model.logits(hidden)
    assert (model.logits(hidden, quantized=True) - logits).abs().max() / logits.abs().max() < 2e-2
