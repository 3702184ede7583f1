"""The model runner's batched, paged, prefix-cached path against one contiguous forward pass."""

from __future__ import annotations

import random

import pytest
import torch

from engine import kv_store
from engine.kv_cache import BlockManager
from engine.loader import load
from engine.model_runner import ModelRunner, StepInput, num_blocks_for
from engine.scheduler import Scheduler
from engine.sequence import Sequence


@pytest.fixture(scope="module")
def model(tiny_llama):
    return load(tiny_llama, progress=False).model


@pytest.fixture(scope="module")
def model_bf16(tiny_llama):
    return load(tiny_llama, torch.bfloat16, progress=False).model


def reference_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """Logits at every position of ids from one unbatched pass that never touches the KV cache."""
    return runner.model.logits(runner.hidden_states(ids))


def drive(sched: Scheduler, runner: ModelRunner, futures: dict[int, list[int]]) -> dict[int, list[torch.Tensor]]:
    """Run the scheduler to the end, teacher-forcing each sequence's next tokens from `futures`;
    returns the logits the runner produced for each sequence, in order."""
    got: dict[int, list[torch.Tensor]] = {sid: [] for sid in futures}
    while sched.has_work:
        plan = sched.schedule()
        inputs = [StepInput(i.token_ids, i.start, i.slots, i.seq.block_table, i.samples) for i in plan.items]
        logits = runner.execute(inputs, plan.copies)
        sampled = {}
        for row, item in enumerate(i for i in plan.items if i.samples):
            got[item.seq.seq_id].append(logits[row])
            sampled[item.seq.seq_id] = futures[item.seq.seq_id][len(item.seq.output_ids)]
        sched.postprocess(plan, sampled)
    return got


# bfloat16: decode steps take the grouped-matmul attention on CPU, the contiguous reference SDPA; they agree to
# bf16 rounding. int8 KV: the reference keeps K/V exact, the paged run reads them back from int8
@pytest.mark.parametrize("model_name, tolerance, kv_int8", [("model", 1e-4, False), ("model_bf16", 1e-1, False),
                                                            ("model", 1.5e-1, True)])
def test_batched_paged_prefix_cached_logits_match_a_contiguous_run(request, model_name, tolerance, kv_int8):
    model = request.getfixturevalue(model_name)
    rng = random.Random(0)
    block_size = 4
    runner = ModelRunner(model, num_blocks=64, block_size=block_size, kv_int8=kv_int8)
    sched = Scheduler(BlockManager(64, block_size), max_num_seqs=8, max_step_tokens=24, prefill_chunk=7)
    shared = [rng.randrange(256) for _ in range(21)]
    prompts = [shared + [rng.randrange(256) for _ in range(rng.randrange(1, 9))] for _ in range(5)]
    futures = {i: [rng.randrange(256) for _ in range(6)] for i in range(len(prompts))}
    sched.add(Sequence(0, prompts[0], max_tokens=6))
    got = drive(sched, runner, {0: futures[0]})  # warms the prefix cache
    later = [Sequence(i, prompts[i], max_tokens=6) for i in range(1, len(prompts))]
    for seq in later:
        sched.add(seq)
    got |= drive(sched, runner, {i: futures[i] for i in range(1, len(prompts))})
    assert all(seq.num_cached_prefix == 20 for seq in later)  # 5 of the 21 shared tokens' blocks
    for i, prompt in enumerate(prompts):
        full = prompt + futures[i]
        ref = reference_logits(runner, full)[len(prompt) - 1:len(full) - 1]
        torch.testing.assert_close(torch.stack(got[i]), ref, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("kv_int8", [False, True])
def test_copy_on_write_blocks_are_copied_before_writes(model, kv_int8):
    runner = ModelRunner(model, num_blocks=8, block_size=4, kv_int8=kv_int8)
    runner.kv[:, :, 4:8] = 3  # block 1
    runner.execute([StepInput([5], 0, [8], [2], samples=False)], copies=[(1, 3)])
    assert torch.equal(runner.kv[:, :, 12:16], runner.kv[:, :, 4:8])
    if kv_int8:
        runner.kv_scales[:, :, 4:8] = 0.5
        runner.execute([StepInput([5], 0, [8], [2], samples=False)], copies=[(1, 3)])
        assert torch.equal(runner.kv_scales[:, :, 12:16], runner.kv_scales[:, :, 4:8])


def test_compiled_decode_steps_match_eager_ones(tiny_llama):
    """compile=True: decode steps (one and several sequences) through torch.compile, prompts eager; same logits."""
    model = load(tiny_llama, progress=False).model
    eager, compiled = ModelRunner(model, 16, 4), ModelRunner(model, 16, 4, compile=True)
    compiled.warm_up()
    for runner in (eager, compiled):
        runner.execute([StepInput(list(range(10, 19)), 0, list(range(9)), [0, 1, 2], False, prompt=True),
                        StepInput(list(range(30, 35)), 0, list(range(12, 17)), [3, 4], False, prompt=True)])
    steps = [[StepInput([7], 9, [9], [0, 1, 2], True)],
             [StepInput([8], 10, [10], [0, 1, 2], True), StepInput([9], 5, [17], [3, 4], True)]]
    for inputs in steps:
        torch.testing.assert_close(compiled.execute(inputs), eager.execute(inputs), rtol=1e-4, atol=1e-4)
    assert compiled._compiled is not None and eager._compiled is None


def test_kv_memory_as_a_fraction_counts_what_torchs_cuda_allocator_holds_unused_as_free(model, monkeypatch):
    """An engine unloaded in this process leaves its memory in torch's cache, which the driver counts as used."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 * gib, 8 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 5 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 1 * gib)
    per_block = kv_store.bytes_per_token(model.cfg, torch.float32, False) * 16
    assert num_blocks_for(model, 0.5, 16, torch.float32, "cuda") == 3 * gib // per_block
