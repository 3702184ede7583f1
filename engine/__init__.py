"""Velo's in-process inference engine: paged KV cache, radix prefix cache, continuous batching.

    eng = LLMEngine.from_pretrained(path, EngineConfig(device="cpu"))
    async for out in eng.generate(eng.tokenizer.encode(prompt), SamplingParams(max_tokens=64)):
        print(out.text, end="")

Never imports `proxy` or `adapters`. The names below load on first use, so importing a torch-free part
(`engine.scheduler`, `engine.kv_cache`, ...) does not load torch through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.default_model import default_model_path
    from engine.engine import LLMEngine
    from engine.requests import RequestOutput
    from engine.sampling import SamplingParams

_HOMES = {"EngineConfig": "engine.config", "LLMEngine": "engine.engine", "RequestOutput": "engine.requests",
          "SamplingParams": "engine.sampling", "default_model_path": "engine.default_model"}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
