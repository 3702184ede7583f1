"""End to end through LLMEngine: greedy parity with transformers, batching, preemption, cancellation."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from engine import SamplingParams
from engine.requests import RequestState
from tests.engine.conftest import collect, generate, submit, text_of, tokens_of
from tests.engine.tiny import write_tiny_model

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 32,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0}
GREEDY = dict(temperature=0, ignore_eos=True)


def slot_bytes(eng) -> int:
    """KV bytes of one token (all layers, K and V)."""
    return eng.runner.kv[:, :, 0].numel() * eng.runner.kv.element_size()


def hf_greedy(path: str, prompt_ids: list[int], n: int) -> list[int]:
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("arch, overrides", [
    ("llama", {}), ("llama", {"rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True}),
    ("qwen2", {}), ("qwen3", {})])
def test_greedy_matches_transformers(tmp_path, engine_factory, arch, overrides):
    path = write_tiny_model(str(tmp_path), arch, **overrides)
    eng = engine_factory(path, block_size=4, prefill_chunk=16)  # several blocks and prefill chunks
    prompt = eng.tokenizer.encode("The quick brown fox jumps over the lazy dog; ünïcödé too.")
    ours = tokens_of(generate(eng, prompt, SamplingParams(max_tokens=24, **GREEDY)))
    assert ours == hf_greedy(path, prompt, 24)


def test_a_prompt_read_in_chunks_reports_its_progress_before_the_first_token(tiny_llama, engine_factory):
    """Nothing came out until the first token, so a reader waiting for one could not tell a CPU reading a long
    prompt from a stalled engine (the engine backend's first_token_timeout starts again at each report)."""
    eng = engine_factory(tiny_llama, block_size=4, prefill_chunk=8, enable_prefix_cache=False)
    outputs = generate(eng, list(range(1, 31)), SamplingParams(max_tokens=3, **GREEDY))  # 30 tokens: 4 chunks
    progress = [o for o in outputs if not o.token_ids and not o.finished]
    assert len(progress) == 3 and outputs[:3] == progress and all(o.text == "" for o in progress)
    assert len(tokens_of(outputs)) == 3


def test_concurrent_requests_match_solo_runs(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama, block_size=4, max_step_tokens=40, prefill_chunk=8)
    rng = random.Random(0)
    shared = [rng.randrange(256) for _ in range(30)]
    prompts = [shared[:rng.randrange(5, 30)] + [rng.randrange(256) for _ in range(rng.randrange(1, 20))]
               for _ in range(8)]
    solo = [tokens_of(generate(eng, p, SamplingParams(max_tokens=12, **GREEDY))) for p in prompts]
    queues = [submit(eng, p, SamplingParams(max_tokens=12, **GREEDY))[1] for p in prompts]
    together = [collect(q) for q in queues]
    assert [tokens_of(o) for o in together] == solo
    assert sum(o[-1].num_cached_tokens for o in together) > 0  # the second round hit the prefix cache


def test_preemption_under_tight_memory_keeps_outputs(tiny_llama, engine_factory):
    roomy = engine_factory(tiny_llama, block_size=4)
    tight = engine_factory(tiny_llama, block_size=4, kv_memory=slot_bytes(roomy) * 4 * 16, enable_prefix_cache=False)
    prompts = [[(7 * i + j) % 256 for j in range(10 + i)] for i in range(6)]
    expected = [tokens_of(generate(roomy, p, SamplingParams(max_tokens=30, **GREEDY))) for p in prompts]
    queues = [submit(tight, p, SamplingParams(max_tokens=30, **GREEDY))[1] for p in prompts]
    assert [tokens_of(collect(q)) for q in queues] == expected
    assert tight.metrics()["preemptions"] > 0


def test_cached_prompt_tokens_are_those_of_the_first_admission_never_more_than_the_prompt(tiny_llama, engine_factory):
    """Twins in a pool too small for both: one is preempted and admitted again over blocks the other cached, which
    cover its own answer too; that hit was reported as its cached prompt (80 of a 46-token prompt on SmolLM2)."""
    roomy = engine_factory(tiny_llama, block_size=4)
    tight = engine_factory(tiny_llama, block_size=4, kv_memory=slot_bytes(roomy) * 4 * 12)
    prompt = [(5 * j) % 256 for j in range(14)]
    finals = [collect(q)[-1] for q in [submit(tight, prompt, SamplingParams(max_tokens=30, **GREEDY))[1]
                                       for _ in range(2)]]
    assert tight.metrics()["preemptions"] > 0
    assert all(0 <= f.num_cached_tokens < f.num_prompt_tokens == 14 for f in finals)
    assert sum(f.num_cached_tokens for f in finals) == tight.metrics()["cached_prompt_tokens"]


def test_abort_finishes_the_stream_and_frees_blocks(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama, block_size=4)
    request_id, outputs = submit(eng, list(range(40)), SamplingParams(max_tokens=10_000 - 41, **GREEDY))
    first = outputs.get(timeout=30)
    assert not first.finished
    eng.abort(request_id)
    assert collect(outputs)[-1].finish_reason == "abort"
    deadline = time.time() + 10
    while eng.metrics()["running"] and time.time() < deadline:
        time.sleep(0.01)
    metrics = eng.metrics()
    assert metrics["running"] == metrics["waiting"] == 0 and metrics["kv_usage"] == 0.0


def test_requests_sent_as_or_after_the_engine_shuts_down_fail_rather_than_wait(tiny_llama, engine_factory):
    """Those queued behind the stop were never read: their callers waited forever (the engine backend's until its
    first_token_timeout, 5 minutes), as did one sent to an engine already shut down."""
    eng = engine_factory(tiny_llama)
    stopping = threading.Thread(target=eng.shutdown)
    stopping.start()

    def end_of_one() -> str:
        try:
            return collect(submit(eng, [1, 2, 3], SamplingParams(max_tokens=2, **GREEDY))[1], 10)[-1].finish_reason
        except RuntimeError as e:  # refused (sent after the stop) or failed (running as it stopped)
            return str(e)
    ends = [end_of_one() for _ in range(20)]
    stopping.join()
    ends.append(end_of_one())
    assert set(ends) <= {"length", "engine shut down"} and ends[-1] == "engine shut down"


def test_a_step_that_fails_after_finishing_requests_fails_them_too(tiny_llama, engine_factory, monkeypatch):
    """The step's requests that ended in it were out of the scheduler's queues before they were streamed: a failure
    then (here, streaming the first of them) failed nobody, and all three callers waited forever."""
    eng = engine_factory(tiny_llama)
    emit = RequestState.emit

    def failing(self: RequestState, seq, sample) -> int:
        if seq.finished:
            raise ValueError("no text for this token")
        return emit(self, seq, sample)
    monkeypatch.setattr(RequestState, "emit", failing)
    requests = [submit(eng, [i, 2, 3], SamplingParams(max_tokens=3, **GREEDY))[1] for i in range(1, 4)]
    for outputs in requests:
        with pytest.raises(ValueError, match="no text for this token"):
            collect(outputs, timeout=10)
    monkeypatch.undo()
    assert tokens_of(generate(eng, [1, 2, 3], SamplingParams(max_tokens=3, **GREEDY)))  # the engine goes on


def test_no_leak_after_random_requests_with_aborts(tiny_llama, engine_factory):
    probe = engine_factory(tiny_llama)
    eng = engine_factory(tiny_llama, block_size=4, kv_memory=slot_bytes(probe) * 4 * 14, max_num_seqs=6,
                         max_step_tokens=32, prefill_chunk=8)
    rng = random.Random(7)
    prefixes = [[rng.randrange(256) for _ in range(24)] for _ in range(3)]
    live = []
    for i in range(150):
        prompt = rng.choice(prefixes)[:rng.randrange(1, 24)] + [rng.randrange(256) for _ in range(rng.randrange(6))]
        params = SamplingParams(max_tokens=rng.randrange(1, 16), temperature=rng.choice([0, 0.8]), seed=i)
        live.append(submit(eng, prompt, params))
        if rng.random() < 0.2:
            eng.abort(rng.choice(live)[0])
    reasons = [collect(q)[-1].finish_reason for _, q in live]
    assert {"length", "abort"} <= set(reasons)
    deadline = time.time() + 10  # the snapshot follows the step after the last output, on the engine's thread
    while eng.metrics()["running"] and time.time() < deadline:
        time.sleep(0.01)
    assert eng.metrics()["preemptions"] > 0 and eng.metrics()["running"] == 0
    eng.shutdown()  # the loop thread is gone: safe to inspect its bookkeeping
    eng.blocks.check_integrity()
    eng.blocks.evict(eng.blocks.num_blocks)
    assert eng.blocks.num_free_blocks == eng.blocks.num_blocks


def test_utf8_is_never_split_and_stop_strings_cut(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama)
    outs = generate(eng, eng.tokenizer.encode("ab"), SamplingParams(max_tokens=60, temperature=1.0, seed=3))
    full = eng.tokenizer.decode(tokens_of(outs)).rstrip("\ufffd")  # broken bytes at the very end are dropped
    assert text_of(outs) == full
    for o in outs:
        o.text.encode("utf-8")  # a lone surrogate or split character would raise or show as U+FFFD
        assert "\ufffd" not in o.text or "\ufffd" in full
    stop = full[10:13]
    cut = generate(eng, eng.tokenizer.encode("ab"), SamplingParams(max_tokens=60, temperature=1.0, seed=3,
                                                                    stop=[stop]))
    assert text_of(cut) == full[:full.index(stop)] and cut[-1].finish_reason == "stop"
    assert cut[-1].stop_string == stop and all(o.stop_string is None for o in cut[:-1])


def test_stop_strings_hold_back_only_a_tail_that_could_still_become_one(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama)
    prompt, sampled = eng.tokenizer.encode("ab"), dict(max_tokens=40, temperature=1.0, seed=5)
    free = [o.text for o in generate(eng, prompt, SamplingParams(**sampled))]
    full = "".join(free)
    never = ["\x00" * 10, "\x01" * 12]  # long stop strings whose first character never comes
    assert not any(s[0] in full for s in never)
    held = [o.text for o in generate(eng, prompt, SamplingParams(**sampled, stop=never))]
    assert held == free  # every token's text is sent as it comes, none held for a stop that cannot start
    tail = full[-6:-3]
    partial = [o.text for o in generate(eng, prompt, SamplingParams(**sampled, stop=[tail + "\x00"]))]
    assert "".join(partial) == full  # held while the tail could start the stop, released at the end
    held_at = max(i for i, o in enumerate(partial) if o != free[i])
    assert held_at > 0 and "".join(partial[:held_at]) == full[:len("".join(partial[:held_at]))]


def test_embeddings_run_between_steps_and_fail_once_the_engine_is_gone(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama, block_size=4)
    alone = eng.embed(["hello", "world"])
    busy = [submit(eng, [1, 2, 3, 4, 5], SamplingParams(max_tokens=40, **GREEDY)) for _ in range(3)]
    during = eng.embed(["hello", "world"])
    assert all(len(collect(q)) for _, q in busy)
    torch.testing.assert_close(torch.tensor(during), torch.tensor(alone))
    assert torch.linalg.vector_norm(torch.tensor(alone), dim=1).tolist() == pytest.approx([1.0, 1.0])
    eng.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        eng.embed(["hello"])


def test_logit_bias_bans_the_token_greedy_decoding_takes(tiny_llama, engine_factory):
    eng = engine_factory(tiny_llama)
    prompt = eng.tokenizer.encode("ab")
    [first] = tokens_of(generate(eng, prompt, SamplingParams(max_tokens=1, **GREEDY)))
    [other] = tokens_of(generate(eng, prompt, SamplingParams(max_tokens=1, logit_bias={first: -100}, **GREEDY)))
    [forced] = tokens_of(generate(eng, prompt, SamplingParams(max_tokens=1, logit_bias={7: 100}, **GREEDY)))
    assert other != first and forced == 7
