"""The engine's settings and what it streams back per request."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.speculative import SpeculativeConfig


@dataclass
class EngineConfig:
    device: str = "cpu"
    dtype: str | torch.dtype = "auto"      # "auto": float32 on CPU, bfloat16 on CUDA
    kv_memory: int | float = 512 * 2**20   # bytes if > 1, else a fraction of the memory free at start
    block_size: int = 16
    max_num_seqs: int = 32
    max_step_tokens: int = 2048            # tokens per forward step (decodes + prefill chunks)
    prefill_chunk: int = 512               # longest piece of one prompt per step (chunked prefill)
    enable_prefix_cache: bool = True
    seed: int | None = None                # for requests without their own seed
    progress: bool = True                  # progress bar while loading
    num_threads: int | None = None         # CPU threads for the engine thread's ops (None: torch's default)
    speculative: SpeculativeConfig | None = None  # speculative decoding for eligible requests; None: off

    def torch_dtype(self) -> torch.dtype:
        if isinstance(self.dtype, torch.dtype):
            return self.dtype
        if self.dtype == "auto":
            return torch.bfloat16 if torch.device(self.device).type == "cuda" else torch.float32
        return getattr(torch, self.dtype)


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
