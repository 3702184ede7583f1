"""Fixtures for engine tests: tiny random checkpoints (module-scoped, they take a second to write) and a
synchronous way to drive LLMEngine from a test thread."""

from __future__ import annotations

import os
import queue
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams
from tests.engine.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("llama")), "llama")


@pytest.fixture(scope="module")
def tiny_draft(tiny_llama, tmp_path_factory) -> str:
    """The target's weights plus noise, same tokenizer: a draft that is often but not always right."""
    path = str(tmp_path_factory.mktemp("draft"))
    shutil.copytree(tiny_llama, path, dirs_exist_ok=True)
    file = os.path.join(path, "model.safetensors")
    g = torch.Generator().manual_seed(1)
    save_file({k: v + 0.05 * v.std() * torch.randn(v.shape, generator=g) if v.dim() == 2 else v
               for k, v in load_file(file).items()}, file)
    return path


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
