"""The engine's settings and what it streams back per request."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.speculative import SpeculativeConfig


@dataclass
class EngineConfig:
    device: str = "cpu"
    dtype: str | torch.dtype = "auto"      # "auto": bfloat16 on CUDA and on CPUs with native bf16, else float32
    kv_memory: int | float = 512 * 2**20   # bytes if > 1, else a fraction of the memory free at start
    block_size: int = 16
    max_num_seqs: int = 32
    max_step_tokens: int = 2048            # tokens per forward step (decodes + prefill chunks)
    prefill_chunk: int = 512               # longest piece of one prompt per step (chunked prefill)
    enable_prefix_cache: bool = True
    seed: int | None = None                # for requests without their own seed
    progress: bool = True                  # progress bar while loading
    num_threads: int | None = None         # CPU threads for the engine thread's ops (None: torch's default)
    int4_weights: bool = True              # CPU: 4-bit GGUF layer matrices stay 4-bit for decode (engine/int4.py)
    speculative: SpeculativeConfig | None = None  # speculative decoding for eligible requests; None: off

    def torch_dtype(self) -> torch.dtype:
        if isinstance(self.dtype, torch.dtype):
            return self.dtype
        if self.dtype == "auto":
            return torch.bfloat16 if torch.device(self.device).type == "cuda" or _cpu_has_bf16() else torch.float32
        return getattr(torch, self.dtype)


def _cpu_has_bf16() -> bool:
    """AVX512-BF16 / AMX: bf16 matmuls run natively, halving the weight bytes each decode step reads (a
    memory-bound step on CPU: 68 -> 35 ms for SmolLM2-135M on 2 cores); without them bf16 is emulated and slower."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@dataclass
class RequestOutput:
    """One streamed step of a request. `text` is the new text since the previous output (never a
    broken UTF-8 character, never part of a stop string); `token_ids` the new tokens."""
    request_id: int
    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None   # "stop", "length" or "abort"
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0         # prompt tokens served from the prefix cache
    num_output_tokens: int = 0
    logprobs: list[dict] | None = None  # per new token: {"token_id", "token", "logprob", "top_logprobs"}
    extra: dict = field(default_factory=dict)
