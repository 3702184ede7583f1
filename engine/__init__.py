"""Velo's in-process inference engine: paged KV cache, radix prefix cache, continuous batching.

    eng = LLMEngine.from_pretrained(path, EngineConfig(device="cpu"))
    async for out in eng.generate(eng.tokenizer.encode(prompt), SamplingParams(max_tokens=64)):
        print(out.text, end="")

Never imports `proxy` or `adapters`.
"""

from engine.config import EngineConfig, RequestOutput
from engine.embedded import default_model_path
from engine.engine import LLMEngine
from engine.sampling import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "default_model_path"]
