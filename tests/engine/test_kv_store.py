"""The KV cache's tensors: int8 blocks with float16 scales, their size, and an engine serving from them."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, SamplingParams
from engine.kv_store import GROUP, LayerKV, allocate, bytes_per_token, dequantize, quantize
from engine.models.llama import ModelConfig
from tests.engine.conftest import generate, tokens_of

CFG = ModelConfig("llama", 100, 64, 128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64)


def test_int8_round_trip_is_within_half_a_step_of_each_block():
    x = torch.randn(50, 2, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 64)
    q, scale = quantize(x)  # blocks of very different magnitudes
    assert q.dtype == torch.int8 and scale.shape == (50, 2, 64 // GROUP)
    error = (dequantize(q, scale, torch.float32) - x).abs().unflatten(-1, (-1, GROUP)).amax(dim=-1)
    assert (error <= scale.float() * 0.5 * (1 + 1e-6)).all()
    assert torch.equal(dequantize(*quantize(torch.zeros(1, 1, 64)), torch.float32), torch.zeros(1, 1, 64))


def test_int8_takes_at_most_55_percent_of_bf16_bytes():
    assert bytes_per_token(CFG, torch.bfloat16, quantized=True) / bytes_per_token(CFG, torch.bfloat16, False) <= 0.55
    kv, scales = allocate(CFG, 16, torch.bfloat16, True, torch.device("cpu"))
    actual = kv.numel() * kv.element_size() + scales.numel() * scales.element_size()
    assert actual == 16 * bytes_per_token(CFG, torch.bfloat16, True)


def test_a_layer_reads_back_what_it_wrote():
    kv, scales = allocate(CFG, 8, torch.float32, True, torch.device("cpu"))
    layer = LayerKV(kv[1], scales[1])
    k, v = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    slots = torch.tensor([6, 1, 4])
    layer.write(slots, k, v)
    got_k, got_v = layer.read(torch.tensor([1, 4, 6]), torch.float32)
    torch.testing.assert_close(got_k, k[[1, 2, 0]], atol=0.02, rtol=0)
    torch.testing.assert_close(got_v, v[[1, 2, 0]], atol=0.02, rtol=0)
    assert (kv[0] == 0).all() and (kv[1, :, [0, 2, 3, 5, 7]] == 0).all()  # other layers and slots untouched


@pytest.mark.parametrize("int8", [False, True])
def test_float16_keys_and_values_that_overflowed_are_kept_as_zeros(int8):
    """An inf in one request's K/V reached another request in its decode batch: padded key positions point at block
    0 and stale slots, which attention masks, but 0 * inf is NaN, and that request's answer became token 0."""
    kv, scales = allocate(CFG, 4, torch.float16, int8, torch.device("cpu"))
    layer = LayerKV(kv[0], scales[0] if int8 else None)
    k = torch.full((2, 2, 64), float("inf"), dtype=torch.float16)
    v = torch.full((2, 2, 64), float("nan"), dtype=torch.float16)
    layer.write(torch.tensor([0, 1]), k, -k)
    layer.write(torch.tensor([2, 3]), v, k)
    got_k, got_v = layer.read(torch.arange(4), torch.float16)
    assert torch.isfinite(got_k).all() and torch.isfinite(got_v).all()


def test_an_engine_with_int8_kv_generates_like_one_with_exact_kv(tiny_llama, engine_factory):
    exact = engine_factory(tiny_llama, block_size=4)
    int8 = engine_factory(tiny_llama, block_size=4, kv_dtype="int8")
    assert int8.runner.kv.dtype == torch.int8 and int8.blocks.num_blocks > 1.8 * exact.blocks.num_blocks
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [[(7 * i + j) % 256 for j in range(20 + i)] for i in range(6)]
    same = sum(tokens_of(generate(int8, p, params)) == tokens_of(generate(exact, p, params)) for p in prompts)
    assert same >= 5  # greedy can only part where the top two logits are within the int8 rounding


def test_kv_dtype_is_checked():
    with pytest.raises(ValueError, match="kv_dtype"):
        EngineConfig(kv_dtype="fp8")
