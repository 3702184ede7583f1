"""Fixtures for engine tests: tiny random checkpoints (module-scoped, they take a second to write) and a
synchronous way to drive LLMEngine from a test thread."""

from __future__ import annotations

import queue

import pytest

from engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams
from tests.engine.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("llama")), "llama")


@pytest.fixture
def engine_factory():
    engines = []

    def make(path: str, **config) -> LLMEngine:
        # tiny models need little KV memory; float32 so logits compare with transformers at tight tolerances
        config = {"progress": False, "kv_memory": 8 * 2**20, "dtype": "float32"} | config
        engines.append(LLMEngine.from_pretrained(path, EngineConfig(**config)))
        return engines[-1]

    yield make
    for eng in engines:
        eng.shutdown()


def submit(eng: LLMEngine, prompt_ids: list[int], params: SamplingParams) -> tuple[int, queue.Queue]:
    outputs: queue.Queue = queue.Queue()
    return eng.add_request(prompt_ids, params, outputs.put), outputs


def collect(outputs: queue.Queue, timeout: float = 60) -> list[RequestOutput]:
    """Every output of one request, up to and including the finished one."""
    got = []
    while not got or not got[-1].finished:
        out = outputs.get(timeout=timeout)
        if isinstance(out, BaseException):
            raise out
        got.append(out)
    return got


def generate(eng: LLMEngine, prompt_ids: list[int], params: SamplingParams) -> list[RequestOutput]:
    return collect(submit(eng, prompt_ids, params)[1])


def tokens_of(outputs: list[RequestOutput]) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


def text_of(outputs: list[RequestOutput]) -> str:
    return "".join(o.text for o in outputs)
