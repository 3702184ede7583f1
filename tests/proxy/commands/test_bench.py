"""`velo bench` against Velo over a scripted backend, an OpenAI-compatible fake directly, and the real
llama-server through Velo: what it sends, what it counts, what it writes."""
from __future__ import annotations

import orjson
import pytest
from tqdm import tqdm

from adapters.protocol import ModelInfo
from proxy.commands.bench import BenchOptions, calibrated_words, measure, output_prefix
from proxy.commands.bench_roofline import roofline_line
from proxy.commands.bench_stats import LevelResult, Sample, cache_line
from tests.engine.tiny import write_tiny_spm_gguf
from tests.fakes import FakeOpenAI
from tests.scripted import Script, ScriptedBackend


def _bar() -> tqdm:
    return tqdm(disable=True)


async def test_levels_cache_probe_and_what_reaches_the_backend(base_url, scripted: ScriptedBackend):
    scripted.script = Script(pieces=["a", "b", "c", "d"])
    opts = BenchOptions(base=base_url, concurrency=[1, 3], prompt_tokens=20, output_tokens=4, requests=3,
                        cache_repeats=4)
    report = await measure(opts, _bar())
    assert report.model == "tiny:latest" and report.tokens_counted_from == "usage"
    assert [(r.concurrency, r.requests, r.errors) for r in report.levels] == [(1, 3, 0), (3, 3, 0)]
    for level in report.levels:  # the scripted backend reports 4 completion tokens, 5 prompt tokens
        assert level.output_tokens_mean == 4 and level.prompt_tokens_mean == 5
        assert level.ttft_p50_s is not None and level.ttft_p50_s <= level.ttft_p99_s
        assert level.stream_tok_s_p50 > 0 and level.aggregate_tok_s > 0
    assert report.cache.miss_cache == "miss" and report.cache.hit_cache == "exact"
    assert report.cache.repeats == 4 and report.cache.hit_p50_s is not None
    # warm-up + 6 timed requests + the probe's first send reach the backend; its 4 repeats are cache hits
    assert len(scripted.requests) == 1 + 6 + 1
    prompts = [r.messages[0].content for r in scripted.requests]
    assert len(set(prompts)) == len(prompts)  # every timed prompt is its own: no coalescing, no prefix reuse
    assert all(r.options.max_tokens == 4 for r in scripted.requests)
    # the probe is greedy; the timed requests set no temperature and get OpenAI's default of 1
    assert scripted.requests[-1].options.temperature == 0 and scripted.requests[1].options.temperature == 1.0


async def test_directly_against_an_openai_server():
    async with FakeOpenAI(models=["fake-gpt"]) as fake:
        fake.script.reply = "one two three four five six"
        report = await measure(BenchOptions(base=fake.url, concurrency=[1, 2], requests=2, cache_repeats=2,
                                            prompt_tokens=16, output_tokens=4), _bar())
    assert report.model == "fake-gpt" and report.tokens_counted_from == "usage"
    assert [r.output_tokens_mean for r in report.levels] == [4, 4]  # cut at max_tokens, counted from usage
    assert report.cache.hit_cache == ""  # no X-Velo-Cache: not a Velo
    sent = [r for r in fake.requests if r.path == "/v1/chat/completions"]
    assert all(r.body["stream"] and r.body["stream_options"] == {"include_usage": True} for r in sent)
    # warm-up and timed requests keep out of a response cache; the probe (temperature 0, 3 sends) wants it
    assert [r.headers.get("Cache-Control") for r in sent] == ["no-cache"] * 5 + [None] * 3
    assert [r.body.get("temperature") for r in sent] == [None] * 5 + [0] * 3


async def test_cli_prints_the_table_and_writes_json_and_png(run_cli, base_url, tmp_path):
    result = await run_cli("bench", "--url", base_url, "--concurrency", "1,2", "--requests", "2",
                           "--cache-repeats", "2", "--prompt-tokens", "16", "--out", str(tmp_path / "run"))
    assert result.code == 0, result.err
    assert "concurrency  requests  errors    TTFT p50" in result.out and "cache hit (exact, p50 of 2)" in result.out
    saved = orjson.loads((tmp_path / "run.json").read_bytes())
    assert [lv["concurrency"] for lv in saved["levels"]] == [1, 2] and saved["cache"]["hit_cache"] == "exact"
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_cli_errors_are_one_line(run_cli, base_url, dead_port, tmp_path):
    down = await run_cli("bench", "--url", f"http://127.0.0.1:{dead_port}", "--out", str(tmp_path / "x"))
    assert down.code == 1 and down.err.startswith("velo bench: cannot reach") and down.err.count("\n") == 1
    unknown = await run_cli("bench", "nope:1b", "--url", base_url, "--out", str(tmp_path / "x"))
    assert unknown.code == 1 and unknown.err.startswith("velo bench: model 'nope:1b' is not served by")
    assert not list(tmp_path.iterdir())


async def test_a_level_where_every_request_fails_stops_the_run(base_url, scripted: ScriptedBackend):
    from proxy.commands import CommandError
    opts = BenchOptions(base=base_url, concurrency=[1], requests=2, cache_repeats=1, prompt_tokens=8)

    def fail_after_warmup(_: int) -> None:  # the progress bar ticks after the warm-up: break the backend then
        scripted.script.fail_after = 0
    bar = _bar()
    bar.update = fail_after_warmup  # type: ignore[method-assign]
    with pytest.raises(CommandError, match="every request at concurrency 1 failed: .*scripted backend broke"):
        await measure(opts, bar)


async def test_a_failing_cache_probe_is_reported_and_the_levels_kept(base_url, scripted: ScriptedBackend):
    opts = BenchOptions(base=base_url, concurrency=[1], requests=2, cache_repeats=2, prompt_tokens=8)
    ticks = []

    def break_after_the_level(n: int) -> None:  # warm-up and 2 timed requests, then the backend breaks
        ticks.append(n)
        if len(ticks) == 3:
            scripted.script.fail_after = 0
    bar = _bar()
    bar.update = break_after_the_level  # type: ignore[method-assign]
    report = await measure(opts, bar)
    assert report.levels[0].errors == 0 and report.cache.error.endswith("scripted backend broke mid-stream")
    assert cache_line(report.cache).startswith("the cache probe failed: ")


def test_level_figures():
    samples = [Sample(ttft=0.1, total=1.1, prompt_tokens=10, completion_tokens=11),
               Sample(ttft=0.3, total=2.3, prompt_tokens=10, completion_tokens=21),
               Sample(ttft=None, total=0.2, error="boom")]
    level = LevelResult.of(2, samples, wall_s=2.5)
    assert (level.requests, level.errors, level.first_error) == (3, 1, "boom")
    assert level.stream_tok_s_p50 == pytest.approx(10.0)  # both decode at 10 tok/s after their first token
    assert level.aggregate_tok_s == pytest.approx(32 / 2.5)
    assert level.ttft_p50_s == pytest.approx(0.2) and level.output_tokens_mean == 16


async def test_the_roofline_weighs_the_gguf_the_server_runs(base_url, scripted: ScriptedBackend, tmp_path,
                                                            monkeypatch):
    opts = BenchOptions(base=base_url, concurrency=[1], requests=1, cache_repeats=1, prompt_tokens=8,
                        output_tokens=2)
    assert (await measure(opts, _bar())).gguf is None  # a server that names no file: no roofline
    gguf = write_tiny_spm_gguf(str(tmp_path / "tiny.gguf"), "the cat sat")
    listed = ModelInfo(name="tiny:latest", family="llama", file=gguf)
    monkeypatch.setattr(scripted, "list_models", lambda: _async([listed]))
    assert (await measure(opts, _bar())).gguf == gguf  # as the engine's /api/show says it
    monkeypatch.setattr("engine.roofline.memory_bandwidth", lambda: 10.0)
    from engine.roofline import gguf_decode_bytes
    size = gguf_decode_bytes(gguf)
    line = roofline_line(gguf, 1e9 / size)  # 1 GB/s of weights against a 10 GB/s copy
    assert line.startswith("roofline: one stream at") and "reads 1.00 GB/s" in line and "10% of" in line


async def _async(value):
    return value


def test_prompt_calibration():
    assert calibrated_words(256, 256, 320) == 205  # 0.8 words per token
    assert calibrated_words(256, 256, 0) == 256  # no usage reported: unchanged
    assert calibrated_words(256, 256, 5) == 1024  # a server that counts 5 tokens for 256 words: clamped


@pytest.mark.slow
async def test_through_velo_to_the_real_llama_server(velo_over_llama):
    opts = BenchOptions(base=velo_over_llama, concurrency=[1, 2], requests=2, cache_repeats=2,
                        prompt_tokens=64, output_tokens=8)
    report = await measure(opts, _bar())
    assert report.model == "smollm2:135m" and report.tokens_counted_from == "usage"
    for level in report.levels:
        assert level.errors == 0 and 1 <= level.output_tokens_mean <= 8
        assert 32 <= level.prompt_tokens_mean <= 128  # calibrated to ~64 tokens of the model's own tokenizer
    assert report.cache.hit_cache == "exact" and report.cache.hit_p50_s < report.cache.miss_s


def test_out_names_a_prefix_a_folder_or_a_json_file(tmp_path, monkeypatch):
    """`--out .` failed once the whole run was done, `--out dir/` wrote dir.json beside the folder, and
    `--out results.json` results.json.json."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    name = "velo-bench-m-1"
    assert [output_prefix(out, name) for out in (None, ".", "..", "runs", "new/", "r.json", "r.png", "a/b")] == \
        [tmp_path.__class__(p) for p in (name, name, f"../{name}", f"runs/{name}", f"new/{name}", "r", "r", "a/b")]
