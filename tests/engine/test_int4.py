"""4-bit GGUF matrices kept 4-bit: the same weights as gguf's own dequantizer, the same products as a dense
matmul, and the shipped model loaded that way on CPU."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.int4 import INT4_MAX_ROWS, Int4Linear, Int4Weight, int4_from_gguf
from engine.loader import load
from engine.models.llama import LlamaModel

N, K = 48, 512


@pytest.fixture(scope="module")
def gguf_tensors(tmp_path_factory) -> dict:
    """A GGUF file holding random blocks of each type (every byte pattern is a valid block once its float16
    scales are finite), read back by gguf's own reader."""
    rng = np.random.default_rng(0)
    path = str(tmp_path_factory.mktemp("q") / "blocks.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    for kind in ("Q4_0", "Q4_1", "Q4_K", "Q8_0"):
        qtype = gguf.GGMLQuantizationType[kind]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (N * K // block, size), dtype=np.uint8)
        scales = 1 if kind in ("Q4_0", "Q8_0") else 2  # Q4_1: d, m; Q4_K: d, dmin
        blocks[:, :2 * scales] = rng.uniform(-0.05, 0.05, (len(blocks), scales)).astype(np.float16).view(np.uint8)
        writer.add_tensor(kind, blocks.reshape(N, -1), raw_dtype=qtype)
    writer.add_tensor("F32", rng.standard_normal((N, K), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_four_bit_blocks_are_read_as_gguf_dequantizes_them(gguf_tensors, kind):
    t = gguf_tensors[kind]
    weight = int4_from_gguf(t)
    assert weight.shape == (N, K) and int(weight.q.max()) <= 15
    expected = gguf.quants.dequantize(t.data, t.tensor_type).reshape(N, K)
    np.testing.assert_array_equal(weight.dequantize().numpy(), expected)


def test_other_types_stay_dense(gguf_tensors):
    assert int4_from_gguf(gguf_tensors["Q8_0"]) is None and int4_from_gguf(gguf_tensors["F32"]) is None


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [1, INT4_MAX_ROWS, INT4_MAX_ROWS + 1, 40])  # int4 kernel, then the dense copy
def test_int4_linear_matches_a_dense_matmul(gguf_tensors, dtype, tolerance, rows):
    weight = int4_from_gguf(gguf_tensors["Q4_K"])
    bias = torch.randn(N, dtype=dtype)
    layer = Int4Linear(weight, bias, dtype)
    x = torch.randn(2, rows, K).to(dtype)
    expected = F.linear(x.float(), weight.dequantize(), bias.float())
    error = (layer(x, quantized=True).float() - expected).abs().max() / expected.abs().max()
    assert layer(x, quantized=True).shape == (2, rows, N) and error < tolerance


def test_row_order_and_fusion_keep_the_weights(gguf_tensors):
    a, b = int4_from_gguf(gguf_tensors["Q4_0"]), int4_from_gguf(gguf_tensors["Q4_1"])
    order = np.random.default_rng(1).permutation(N)
    assert torch.equal(a.rows(order).dequantize(), a.dequantize()[torch.from_numpy(order)])
    assert torch.equal(Int4Weight.cat([a, b]).dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


@pytest.fixture(scope="module")
def shipped():
    from engine import default_model_path
    return {int4: load(default_model_path(), torch.bfloat16, progress=False, int4=int4).model for int4 in (True, False)}


def test_shipped_model_runs_its_q4_layers_in_int4(shipped: dict[bool, LlamaModel]):
    packed, dense = shipped[True], shipped[False]
    layers = {f"layers.{name}": m for name, m in packed.layers.named_modules() if isinstance(m, Int4Linear)}
    assert len(layers) == 4 * packed.cfg.num_layers  # qkv, o, gate_up, down: all Q4_1 in this file
    assert packed.num_parameters == dense.num_parameters
    torch.manual_seed(0)
    for name, layer in layers.items():  # q/k rows un-permuted alike, scales rounded to bf16 only
        reference = dense.get_submodule(name)
        assert torch.equal(layer.dense, reference.weight)
        x = torch.randn(1, layer.in_features, dtype=torch.bfloat16)
        expected = reference(x).float()
        assert ((layer(x, quantized=True).float() - expected).abs().max() / expected.abs().max()) < 2e-2, name


def test_shipped_q8_0_head_is_packed_exactly_as_two_planes(shipped: dict[bool, LlamaModel]):
    """The tied Q8_0 embedding: dense for the lookup and prompt steps, two 4-bit planes for decode steps."""
    packed, dense = shipped[True], shipped[False]
    assert dense.packed_head is None and packed.packed_head.planes == 2
    assert packed.packed_head.dense.data_ptr() == packed.embed_tokens.weight.data_ptr()  # one dense copy, shared
    assert torch.equal(packed.embed_tokens.weight, dense.embed_tokens.weight)
    hidden = torch.randn(3, packed.cfg.hidden_size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    expected = dense.logits(hidden)
    assert torch.equal(packed.logits(hidden), expected)  # prompt steps: the dense head
    error = (packed.logits(hidden, quantized=True) - expected).abs().max() / expected.abs().max()
    assert 0 < error < 1e-2



def test_prompt_steps_run_dense_even_on_one_row(gguf_tensors):
    """A prefix-cache hit recomputes a prompt's last token alone: it must get the dense products a full
    prefill gives it, or a greedy answer can change with the cache."""
    layer = Int4Linear(int4_from_gguf(gguf_tensors["Q4_1"]), None, torch.bfloat16)
    x = torch.randn(1, K, dtype=torch.bfloat16)
    assert torch.equal(layer(x, quantized=False), F.linear(x, layer.dense))
    assert not torch.equal(layer(x, quantized=True), F.linear(x, layer.dense))  # the int4 kernel, equal up to rounding



def test_matrices_the_kernel_cannot_pack_stay_dense(tmp_path):
    """The kernel packs output rows by 16: a 72-row o_proj loads as a dense layer, not a crash."""
    from engine.loader import _read_hf_folder
    from tests.engine.tiny import write_tiny_model

    path = write_tiny_model(str(tmp_path), "qwen3", hidden_size=72, head_dim=16)
    cfg, weights, _, _ = _read_hf_folder(path, False)
    name = "model.layers.0.self_attn.o_proj.weight"
    n, k = weights[name].shape
    rng = torch.Generator().manual_seed(0)
    odd = Int4Weight(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=rng),
                     torch.rand(n, k // 32, generator=rng), torch.zeros(n, k // 32))
    weights[name] = odd
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model.load_hf_weights(weights, torch.float32)
    layer = model.layers[0].self_attn.o_proj
    assert (n, odd.fits_kernel) == (72, False) and not isinstance(layer, Int4Linear)
    assert torch.equal(layer.weight, odd.dequantize())
